"""Benchmark harness: timing with warm-up and repeats, bootstrap CIs, provenance, roofline."""

from studylib.bench.provenance import provenance
from studylib.bench.stats import Estimate, bootstrap_ci, estimate, ratio_estimate, timed_repeats

__all__ = ["Estimate", "bootstrap_ci", "estimate", "provenance", "ratio_estimate", "timed_repeats"]
