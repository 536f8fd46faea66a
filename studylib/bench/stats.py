"""Medians with bootstrap confidence intervals, for single quantities and for paired ratios.

A CI is a bootstrap over independent units: prompts, requests, documents, or whole-run repeats. When
one unit was measured several times (repeats of one prompt), pass ``units``: the repeats are averaged
into one value per unit before resampling (a two-level, hierarchical bootstrap that resamples units),
so that 4 prompts x 2 repeats count as 4 units, not 8. With fewer than 2 units there is no CI: the
interval is NaN, and the verdict rules (``studylib.claims``) refuse to decide on it.
"""

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
    if data.size < 2:
        return float("nan"), float("nan")
    if np.all(data == data[0]):
        v = float(statistic(data))
        return v, v
    res = stats.bootstrap(
        (data,), statistic, confidence_level=confidence, n_resamples=2000,
        method="percentile", random_state=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def unit_means(samples: Sequence[float], units: Sequence | None) -> np.ndarray:
    """One value per unit: the mean of that unit's repeats, in order of first appearance."""
    data = np.asarray(samples, dtype=float)
    if units is None:
        return data
    units = list(units)
    if len(units) != data.size:
        raise ValueError(f"units has {len(units)} labels for {data.size} samples")
    order = list(dict.fromkeys(units))
    index = {u: i for i, u in enumerate(order)}
    sums, counts = np.zeros(len(order)), np.zeros(len(order))
    for u, x in zip(units, data, strict=True):
        sums[index[u]] += x
        counts[index[u]] += 1
    return sums / counts


def estimate(samples: Sequence[float], statistic: Callable = np.median, units: Sequence | None = None,
             confidence: float = 0.95) -> Estimate:
    """``statistic`` of the samples with a bootstrap CI at ``confidence`` (95% unless a multiplicity
    correction asks for more, ``studylib.claims.corrected_confidence``); ``n`` counts units (see the
    module doc)."""
    data = [float(x) for x in unit_means(samples, units)]
    lo, hi = bootstrap_ci(data, statistic, confidence=confidence)
    return Estimate(float(statistic(np.asarray(data))) if data else float("nan"), lo, hi, len(data), data)


def ratio_estimate(baseline: Sequence[float], treated: Sequence[float], seed: int = 0,
                   units: Sequence | None = None, confidence: float = 0.95) -> Estimate:
    """Speedup = baseline / treated for paired measurements (same prompt, same run).

    The CI resamples the pairs and takes the ratio of medians, so prompts of different difficulty
    are never mixed up across the two arms. ``units`` labels the pairs' units: repeats of one unit are
    averaged (in each arm) into one pair first.
    """
    if len(baseline) != len(treated):
        raise ValueError("ratio_estimate needs paired samples of equal length")
    b, t = unit_means(baseline, units), unit_means(treated, units)
    point = float(np.median(b) / np.median(t)) if b.size else float("nan")
    if b.size < 2:
        return Estimate(point, float("nan"), float("nan"), int(b.size), (b / t).tolist())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, b.size, size=(2000, b.size))
    boots = np.median(b[idx], axis=1) / np.median(t[idx], axis=1)
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(boots, [tail, 100 - tail])
    return Estimate(point, float(lo), float(hi), int(b.size), (b / t).tolist())


def rotated(items: Sequence, k: int) -> list:
    """``items`` in the order they run for unit ``k``: rotated by ``k`` places. Arms measured once per unit
    run back to back in this order, so no arm always runs first and drift in machine load falls on every
    arm alike (the study's "arms interleaved" rule)."""
    items = list(items)
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


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
