"""Medians with confidence intervals, for single quantities, paired ratios and whole runs.

A CI over prompts, requests or documents is a BCa bootstrap (bias-corrected and accelerated) with
``N_RESAMPLES`` = 10,000 resamples. Its bounds still move with the resampling seed, so every such CI
carries its Monte Carlo error (``Estimate.mc_error``): the spread of the same bound taken in
``MC_BATCHES`` disjoint batches of the resamples, divided by the square root of their number. The
verdict rules read a bound within that error of a bar as touching it (``studylib.claims``), so no
verdict turns on a seed.

When one unit was measured several times (repeats of one prompt), pass ``units``: the repeats are
averaged into one value per unit before resampling, so 4 prompts x 2 repeats count as 4 units, not 8.
With fewer than 2 units there is no CI: the interval is NaN, and the rules refuse to decide on it.

A machine-level number (bandwidth, a step's cost, a speed-up) varies more between processes than
between prompts inside one. Its CI is taken over whole runs (``run_estimate``): each run a fresh
process (``studylib.bench.whole_runs``) gives one median, and the interval is Student's t on the log
of those medians. With 5 runs no bootstrap reaches its nominal coverage (a percentile bootstrap of 5
values covers about 80% where it claims 95%); the t interval is exact when the log run medians are
normal, and ``Estimate.method`` says which interval a number carries. It is widened by a declared
between-session spread (``studylib.bench.session_drift``), which runs inside one session cannot see.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from studylib.verdict import RUN_CI

N_RESAMPLES = 10_000
MC_BATCHES = 20
# Resamples beyond each nominal bound: a corrected level (99.75% for 20 conditions) puts its bound at the
# 0.125% quantile, which 10,000 resamples hold 12 of; the count grows with the level so each tail holds
# at least this many, and a BCa-adjusted quantile that still falls below MIN_TAIL resamples leaves its
# bound unresolved (its Monte Carlo error is then the interval's width, so it decides nothing).
TAIL_RESAMPLES = 100
MIN_TAIL = 10
BCA = "BCa bootstrap, >= 10,000 resamples (100 beyond each bound)"


def resamples_for(confidence: float) -> int:
    """How many bootstrap resamples a CI at ``confidence`` takes: 10,000, or more where the level puts fewer
    than ``TAIL_RESAMPLES`` of them beyond a bound."""
    return max(N_RESAMPLES, math.ceil(TAIL_RESAMPLES / ((1 - confidence) / 2) - 1e-9))
RUN_T = RUN_CI


@dataclass
class Estimate:
    """A point estimate (median unless stated) with its CI, the raw samples, the CI's level, how it was
    computed (``method``) and the Monte Carlo error of its bounds (0 for an analytic interval)."""

    value: float
    ci_low: float
    ci_high: float
    n: int
    samples: list[float]
    confidence: float = 0.95
    method: str = BCA
    mc_error: float = 0.0

    def __str__(self) -> str:
        return f"{self.value:.3g} [{self.ci_low:.3g}, {self.ci_high:.3g}]"

    def to_dict(self) -> dict:
        return asdict(self)


def bca_bounds(theta: float, boots: np.ndarray, jackknife: np.ndarray, confidence: float = 0.95
               ) -> tuple[float, float, float]:
    """The BCa interval from the bootstrap replicates ``boots`` and the leave-one-out values ``jackknife``
    of a statistic whose estimate is ``theta``: (low, high, Monte Carlo error of the bounds).

    The bias correction z0 counts ties at half (a median of few values ties often); the acceleration
    comes from the jackknife's skew. The Monte Carlo error is the larger of the two bounds' standard
    errors, each estimated from ``MC_BATCHES`` disjoint batches of the replicates."""
    from scipy.special import ndtr, ndtri

    boots = np.asarray(boots, dtype=float)
    boots = boots[np.isfinite(boots)]
    b = boots.size
    if b < MC_BATCHES * 10:
        return float("nan"), float("nan"), float("nan")
    prop = (np.count_nonzero(boots < theta) + 0.5 * np.count_nonzero(boots == theta)) / b
    z0 = float(ndtri(min(max(prop, 0.5 / b), 1 - 0.5 / b)))
    jack = np.asarray(jackknife, dtype=float)
    d = jack.mean() - jack
    den = 6.0 * float((d ** 2).sum()) ** 1.5
    a = float((d ** 3).sum()) / den if den > 0 else 0.0
    z = ndtri(np.array([(1 - confidence) / 2, (1 + confidence) / 2]))
    levels = ndtr(z0 + (z0 + z) / (1 - a * (z0 + z)))
    lo, hi = np.quantile(boots, levels)
    resolved = min(levels[0], 1 - levels[1]) * b >= MIN_TAIL
    usable = b - b % MC_BATCHES
    per_batch = np.quantile(boots[:usable].reshape(MC_BATCHES, -1), levels, axis=1)  # (2, batches)
    mc = float(per_batch.std(axis=1, ddof=1).max() / np.sqrt(MC_BATCHES))
    if not resolved:
        mc = max(mc, float(hi - lo))
    return float(lo), float(hi), mc


def _bca_of(data: np.ndarray, statistic: Callable, confidence: float, seed: int) -> tuple[float, float, float]:
    n = data.size
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples_for(confidence), n))
    boots = np.apply_along_axis(statistic, 1, data[idx]) if statistic not in _VECTOR else statistic(data[idx], axis=1)
    jack = np.array([statistic(np.delete(data, i)) for i in range(n)])
    return bca_bounds(float(statistic(data)), boots, jack, confidence)


_VECTOR = {np.median, np.mean}


def bootstrap_ci(
    samples: Sequence[float], statistic: Callable = np.median, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """The BCa interval of ``statistic`` over ``samples`` (see ``bootstrap_interval`` for its Monte Carlo
    error)."""
    lo, hi, _ = bootstrap_interval(samples, statistic, confidence, seed)
    return lo, hi


def bootstrap_interval(samples: Sequence[float], statistic: Callable = np.median, confidence: float = 0.95,
                       seed: int = 0) -> tuple[float, float, float]:
    """(low, high, Monte Carlo error) of the BCa interval; NaN below 2 samples, a point for constant data."""
    data = np.asarray(samples, dtype=float)
    if data.size < 2:
        return float("nan"), float("nan"), float("nan")
    if np.all(data == data[0]):
        v = float(statistic(data))
        return v, v, 0.0
    return _bca_of(data, statistic, confidence, seed)


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
    lo, hi, mc = bootstrap_interval(data, statistic, confidence=confidence)
    method = BCA
    arr = np.asarray(data, dtype=float)
    if 2 <= arr.size < SMALL_N and statistic in _SMALL_N_BOUNDS and np.all(np.isfinite(arr)) and not np.all(arr == arr[0]):
        s_lo, s_hi, coverage, how = _SMALL_N_BOUNDS[statistic](arr, confidence)
        lo, hi, mc, method = _widened(lo, hi, mc, s_lo, s_hi, coverage, confidence, how, arr.size)
    return Estimate(float(statistic(arr)) if data else float("nan"), lo, hi, len(data), data,
                    confidence=confidence, method=method, mc_error=mc)


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
        return Estimate(point, float("nan"), float("nan"), int(b.size), (b / t).tolist(), confidence=confidence)
    if np.all(b / t == (b / t)[0]) and np.all(b == b[0]):
        return Estimate(point, point, point, int(b.size), (b / t).tolist(), confidence=confidence)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, b.size, size=(resamples_for(confidence), b.size))
    boots = np.median(b[idx], axis=1) / np.median(t[idx], axis=1)
    keep = np.ones(b.size, dtype=bool)
    jack = []
    for i in range(b.size):
        keep[i] = False
        jack.append(np.median(b[keep]) / np.median(t[keep]))
        keep[i] = True
    lo, hi, mc = bca_bounds(point, boots, np.array(jack), confidence)
    method = BCA
    if b.size < SMALL_N and np.all(np.isfinite(b / t)):
        # A guard, not this statistic's own interval: the ratio of medians has no distribution-free interval,
        # so below SMALL_N pairs its CI is made to span at least the order-statistic interval of the paired
        # ratios' median (the typical pair's speed-up), which assumes nothing the few pairs cannot show where
        # BCa estimates its own corrections from them.
        lo, hi, mc, method = _widened(lo, hi, mc, *median_order_bounds(b / t, confidence), confidence,
                                      "span the order-statistic interval of the paired ratios' median", b.size)
    return Estimate(point, lo, hi, int(b.size), (b / t).tolist(), confidence=confidence, method=method,
                    mc_error=mc)


# Below this many units a bootstrap interval under-covers (BCa included: it estimates its corrections from
# the same few units), so a ratio's CI there is never narrower than the ratio estimator's t interval.
SMALL_N = 20
SMALL_N_NOTE = (f"below {SMALL_N} units, widened to the ratio estimator's t interval (n - 1 df) where that is "
                "wider")


def median_order_bounds(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The distribution-free interval of a median: the order statistics (x_(j), x_(n+1-j)) with the largest j
    whose coverage, 1 - 2 P(Binomial(n, 1/2) < j), reaches ``confidence``. Returns (low, high, coverage); with
    too few samples for any j to reach the level it is (min, max) with the smaller coverage it has."""
    x = np.sort(np.asarray(samples, dtype=float))
    n = x.size
    if n < 2:
        return float("nan"), float("nan"), 0.0
    j, coverage = 1, 1 - 2 * 0.5**n
    for cand in range(2, n // 2 + 1):
        c = 1 - 2 * float(stats.binom.cdf(cand - 1, n, 0.5))
        if c < confidence:
            break
        j, coverage = cand, c
    return float(x[j - 1]), float(x[n - j]), float(coverage)


def mean_t_bounds(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Student's t interval of a mean (n - 1 df): (low, high, nominal coverage)."""
    x = np.asarray(samples, dtype=float)
    half = float(stats.t.ppf((1 + confidence) / 2, x.size - 1)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return float(x.mean()) - half, float(x.mean()) + half, confidence


def ratio_t_bounds(num: Sequence[float], den: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The t interval of R = sum(num) / sum(den) over paired units: the ratio estimator's linearised standard
    error, sqrt(sum((num - R den)^2) / (n (n - 1))) / mean(den), with Student's t on n - 1 df. Units with
    nothing in either arm contribute nothing; a unit where the arm scored 0 is an ordinary unit (a log-ratio
    interval would have to drop it)."""
    a, b = np.asarray(num, float), np.asarray(den, float)
    n = a.size
    if n < 2 or not b.sum() > 0:
        return float("nan"), float("nan")
    r = float(a.sum() / b.sum())
    se = math.sqrt(float(((a - r * b) ** 2).sum()) / (n * (n - 1))) / float(b.mean())
    q = float(stats.t.ppf((1 + confidence) / 2, n - 1))
    return r - q * se, r + q * se


def ratio_of_sums_bounds(num: Sequence[float], den: Sequence[float], confidence: float = 0.95, seed: int = 0,
                         resamples: int | None = None) -> tuple[float, float, float]:
    """The BCa interval of sum(num) / sum(den) over paired units (both resampled together; a resample whose
    denominator is 0 has no ratio and is dropped), with its Monte Carlo error: (low, high, error). Below
    ``SMALL_N`` units each bound is the wider of BCa's and the t interval's (``ratio_t_bounds``). The
    caller handles fewer than 2 units and a zero total."""
    a, b = np.asarray(num, float), np.asarray(den, float)
    point = float(a.sum() / b.sum())
    resamples = resamples_for(confidence) if resamples is None else resamples
    idx = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))
    top, bottom = a[idx].sum(axis=1), b[idx].sum(axis=1)
    boots = top[bottom > 0] / bottom[bottom > 0]
    keep = np.ones(a.size, dtype=bool)
    jack = []
    for i in range(a.size):  # leave one unit out: the interval's acceleration
        keep[i] = False
        jack.append(a[keep].sum() / b[keep].sum() if b[keep].sum() > 0 else point)
        keep[i] = True
    lo, hi, mc = bca_bounds(point, boots, np.array(jack), confidence)
    if a.size < SMALL_N:
        t_lo, t_hi = ratio_t_bounds(a, b, confidence)
        lo, hi = min(lo, t_lo), max(hi, t_hi)
    return lo, hi, mc


def _widened(lo: float, hi: float, mc: float, s_lo: float, s_hi: float, coverage: float, confidence: float,
             how: str, n: int) -> tuple[float, float, float, str]:
    """A bootstrap interval (lo, hi, its Monte Carlo error mc) widened to (s_lo, s_hi) where that is wider:
    (low, high, error, method). Where even the widest such interval falls short of the level, its bounds carry
    the interval's width as their error, so a bound must clear a bar by a whole width (a row under its minimum
    units is inconclusive anyway)."""
    lo, hi = min(lo, s_lo), max(hi, s_hi)
    method = f"{BCA}; below {SMALL_N} units, widened to {how} where that is wider"
    if coverage < confidence:
        mc = max(mc, hi - lo)
        method += f" ({SHORT_OF_LEVEL} {coverage:.1%} at n={n})"
    return lo, hi, mc, method


SHORT_OF_LEVEL = "which covers only"  # in an estimate's method: its interval falls short of its stated level


def reaches_level(e: Estimate) -> bool:
    """Whether ``e``'s interval covers its stated level: one too few units widened as far as it goes (a
    [min, max] of 2 covers 50%) does not, and a table shows its value alone rather than print it as a CI."""
    return SHORT_OF_LEVEL not in (e.method or "")


# Below SMALL_N units a median's or mean's bootstrap CI is widened to these (low, high, coverage, name).
_SMALL_N_BOUNDS = {
    np.median: lambda x, c: (*median_order_bounds(x, c), "the median's order-statistic interval"),
    np.mean: lambda x, c: (*mean_t_bounds(x, c), "the mean's t interval (n - 1 df)"),
}


def no_ci(n: int = 0, samples: Sequence[float] = (), confidence: float = 0.95, method: str = "no CI") -> Estimate:
    """An estimate without a value or a CI: the verdict rules read it as too few units."""
    nan = float("nan")
    return Estimate(nan, nan, nan, int(n), list(samples), confidence, method, 0.0)


def run_estimate(run_values: Sequence[float], confidence: float = 0.95, session_sd: float = 0.0,
                 session_df: int | None = None) -> Estimate:
    """The CI of a machine-level number over whole runs: one value per run (each run's own median over its
    prompts), Student's t on their logs with n - 1 degrees of freedom, back-transformed. The point is the
    runs' geometric mean. No resampling, so no Monte Carlo error. Needs positive values; with fewer than 2
    runs there is no CI.

    ``session_sd`` (log scale, declared in ``studylib.bench.session_drift``) is the spread between sessions
    that runs inside one session cannot see; the half-width is sqrt((t s/sqrt(n))^2 + (q session_sd)^2),
    so a number near its bar reads inconclusive in every session rather than holds in one of them. q is
    Student's t on ``session_df`` (the degrees of freedom the sd was estimated with), or z without them.

    The bounds themselves move from one set of runs to the next: the mean of the logs by s/sqrt(n) and, in
    another session, by ``session_sd`` as well; the half-width through s by about s/sqrt(2(n-1)). That
    standard error of a bound, taken to the bounds' scale, is returned as the estimate's ``mc_error``, so
    the rules read a bound within it of the bar as touching the bar (neither clears nor misses), as they
    read a bootstrap bound within its Monte Carlo error: two sessions of one commit then cannot put a
    near-bar number on either side of it."""
    x = np.asarray([float(v) for v in run_values], dtype=float)
    if x.size and (not np.all(np.isfinite(x)) or np.any(x <= 0)):
        raise ValueError(f"run_estimate needs positive finite per-run values, got {x.tolist()}")
    if not (math.isfinite(session_sd) and session_sd >= 0):
        raise ValueError(f"session_sd must be a finite sd >= 0 on the log scale, got {session_sd}")
    method = f"{RUN_T} ({max(x.size - 1, 0)} df)"
    if session_df is not None and session_df < 1:
        raise ValueError(f"session_df must be at least 1, got {session_df}")
    if session_sd > 0:
        method += f" and a declared drift sd of {session_sd:g} between cold runs (log" + (
            f", t on its {session_df} df)" if session_df else ")")
    if x.size < 2:
        v = float(x[0]) if x.size else float("nan")
        return Estimate(v, float("nan"), float("nan"), int(x.size), x.tolist(), confidence, method, 0.0)
    logs = np.log(x)
    m, s = float(logs.mean()), float(logs.std(ddof=1))
    within = float(stats.t.ppf((1 + confidence) / 2, x.size - 1)) * s / np.sqrt(x.size)
    q = stats.t.ppf((1 + confidence) / 2, session_df) if session_df else stats.norm.ppf((1 + confidence) / 2)
    between = float(q) * session_sd
    half = math.hypot(within, between)
    # the bound's own standard error over repeated sets of runs, on the log scale: the mean's, and the
    # half-width's through s (d half / d s = within / s * within / half; sd of s ~ s / sqrt(2 (n - 1)))
    dh = (within / half) * (within / s) if s > 0 and half > 0 else 0.0
    # A rerun is another session: its runs' mean also moves by the between-session sd, which the runs of one
    # session cannot show (two cold runs of one commit put C9's q8_0 at 2.80 and 2.71, a log step of 0.033
    # against a within-session error of 0.008). Left out, a bound 0.12 above the bar "held" in one session
    # and was within its error in the next.
    log_err = math.sqrt(s**2 / x.size + session_sd**2 + (dh * s) ** 2 / (2 * (x.size - 1)))
    err = float(np.exp(m + half)) * log_err
    method += (f"; a bound's run-to-run error {log_err:.2g} (log), taken to the upper bound's scale "
               f"({err:.2g}), counts as each bound's Monte Carlo error")
    # The error is taken to the upper bound's scale and guards both bounds. For a lower bound that must
    # clear a bar that is the wider guard (its own scale, exp(m - half) * log_err, is smaller), so a row
    # near its bar reads inconclusive sooner, never later. Guarding each bound on its own scale was tried:
    # it let 92c5035's C9 q8_0 row hold in one session of a pair and not in the other. The session sd sits
    # in both the half-width and the error on purpose: the first says where the quantity is, the second how
    # far this bound moves in the next session; they answer different questions.
    return Estimate(float(np.exp(m)), float(np.exp(m - half)), float(np.exp(m + half)), int(x.size), x.tolist(),
                    confidence, method, err)


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
