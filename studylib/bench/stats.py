"""Medians with bootstrap confidence intervals, for single quantities and for paired ratios."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats


@dataclass
class Estimate:
    """A point estimate (median unless stated) with a 95% bootstrap CI and the raw samples."""

    value: float
    ci_low: float
    ci_high: float
    n: int
    samples: list[float]

    def __str__(self) -> str:
        return f"{self.value:.3g} [{self.ci_low:.3g}, {self.ci_high:.3g}]"

    def to_dict(self) -> dict:
        return asdict(self)


def bootstrap_ci(
    samples: Sequence[float], statistic: Callable = np.median, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    data = np.asarray(samples, dtype=float)
    if data.size < 2 or np.all(data == data[0]):
        v = float(statistic(data)) if data.size else float("nan")
        return v, v
    res = stats.bootstrap(
        (data,), statistic, confidence_level=confidence, n_resamples=2000,
        method="percentile", random_state=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def estimate(samples: Sequence[float], statistic: Callable = np.median) -> Estimate:
    data = [float(x) for x in samples]
    lo, hi = bootstrap_ci(data, statistic)
    return Estimate(float(statistic(np.asarray(data))) if data else float("nan"), lo, hi, len(data), data)


def ratio_estimate(baseline: Sequence[float], treated: Sequence[float], seed: int = 0) -> Estimate:
    """Speedup = baseline / treated for paired measurements (same prompt, same run).

    The CI resamples the pairs and takes the ratio of medians, so prompts of different difficulty
    are never mixed up across the two arms.
    """
    b, t = np.asarray(baseline, float), np.asarray(treated, float)
    if b.shape != t.shape:
        raise ValueError("ratio_estimate needs paired samples of equal length")
    point = float(np.median(b) / np.median(t))
    if b.size < 2:
        return Estimate(point, point, point, int(b.size), (b / t).tolist())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, b.size, size=(2000, b.size))
    boots = np.median(b[idx], axis=1) / np.median(t[idx], axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return Estimate(point, float(lo), float(hi), int(b.size), (b / t).tolist())


def timed_repeats(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls after ``warmup`` discarded ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out
