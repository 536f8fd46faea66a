"""Chapter 1, the step against the rows in it: where this CPU stops being a memory-bound device.

Parallel decoding rests on one premise: a step over k rows (k drafted tokens to verify, a Jacobi window,
k requests in a batch) costs about what a 1-row step costs, because the step is bound by reading the
weights. Each engine (one weights format and activation arithmetic) runs steps of 1..64 rows after the
same cached context, the engines and row counts interleaved per repeat (``bench.steps``), and the
measured v(k) = t(k) / t(1) is set beside a roofline *model* of the same engine: the step's weight
bytes over the measured bandwidth, against k times a row's multiply-adds over the measured peak of that
engine's own kernel; the ridge point is where the two meet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from studylib.bench.stats import rotated
from studylib.bench.steps import (
    kernel_path,
    macs_per_row,
    measure_peak_gmacs,
    roofline_model,
    step_times,
    summarise,
)
from studylib.progress import progress_bar


def rows_sweep(models: Mapping[str, object], rows: Sequence[int], context: int, repeats: int,
               progress: bool = True) -> pd.DataFrame:
    """Seconds per step for every engine and row count; per repeat the engines run in rotated order
    and each runs every row count (rotated within, ``step_times``)."""
    out = []
    rows = sorted({1, *rows})
    for r in progress_bar(range(repeats), desc="step vs rows", progress=progress):
        for name in rotated(list(models), r):
            t = step_times(models[name], rows, context, 1, progress=False)
            out.append(t.assign(engine=name, repeat=r))
    return pd.concat(out, ignore_index=True)


def rows_summary(times: pd.DataFrame, models: Mapping[str, object], bandwidth_gbs: float) -> pd.DataFrame:
    """Per engine and rows: median ms with CI, v(k) with CI, and the roofline model's v(k) and ridge
    (columns ``v_model``, ``ridge_rows``: a model, not a measurement)."""
    from studylib.models.weights import weight_bytes

    parts = []
    for name, g in times.groupby("engine", sort=False):
        m = models[name]
        s = summarise(g)
        peak = measure_peak_gmacs(m)
        curve = roofline_model(sorted(s.rows), weight_bytes(m), macs_per_row(m), bandwidth_gbs, peak)
        s["engine"], s["kernel"], s["peak_gmacs"] = name, kernel_path(m), peak
        s["v_model"] = [curve["v_model"][str(k)] for k in s.rows]
        s["ridge_rows"] = curve["ridge_rows"]
        parts.append(s)
    return pd.concat(parts, ignore_index=True)


def memory_bound_up_to(summary: pd.DataFrame, engine: str, bar: float = 1.5) -> int | None:
    """The largest row count whose measured v(k) stays at or below ``bar`` (upper CI end), i.e. where a
    k-row step still costs at most ``bar`` one-row steps; None if even 2 rows cost more."""
    g = summary[(summary.engine == engine) & (summary.rows > 1)].sort_values("rows")
    ok = g[g.v_high <= bar]
    return int(ok.rows.max()) if len(ok) else None


def plot_rows(summary: pd.DataFrame, ax=None):
    """v(k) against rows per engine (measured, with CI) and the roofline model (dashed)."""
    import matplotlib.pyplot as plt

    from studylib import plots

    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    palette = plots.palette(list(summary.engine.unique()))
    for name, g in summary.groupby("engine", sort=False):
        c = palette[name]
        ax.errorbar(g.rows, g.v, yerr=[g.v - g.v_low, g.v_high - g.v], marker="o", color=c, capsize=3,
                    label=f"{name} (measured)")
        ax.plot(g.rows, g.v_model, ls="--", color=c, alpha=0.7, label=f"{name} (roofline model)")
    ax.plot(sorted(summary.rows.unique()), [1] * summary.rows.nunique(), color="grey", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="rows in the step (tokens verified, or requests batched)",
           ylabel="v(k): cost relative to a 1-row step", title="When does a k-row step cost one step?")
    ticks = sorted(summary.rows.unique())
    ax.set_xticks(ticks, labels=[str(t) for t in ticks])
    ax.legend(fontsize=8)
    return plots.tidy(ax)


def rows_text(summary: pd.DataFrame, bar: float = 1.5) -> str:
    parts = []
    for name, g in summary.groupby("engine", sort=False):
        s = g.set_index("rows")
        upto = memory_bound_up_to(summary, name, bar)
        k8 = s.loc[8] if 8 in s.index else None
        at8 = f"v(8) = {k8.v:.2f} (CI {k8.v_low:.2f}-{k8.v_high:.2f})" if k8 is not None else ""
        reach = (f"a step of up to {upto} rows costs at most {bar:g} one-row steps" if upto
                 else f"already 2 rows cost more than {bar:g} one-row steps")
        parts.append(f"**{name}** ({g.kernel.iloc[0]}): {at8}; {reach}; the roofline model puts its ridge at "
                     f"{g.ridge_rows.iloc[0]:.1f} rows from a measured kernel peak of {g.peak_gmacs.iloc[0]:.0f} "
                     f"G multiply-adds/s")
    n = int(summary.n.min())
    return ("; ".join(parts) + f" (medians of {n} interleaved repeats). Below the ridge a step reads more than it "
            "computes and extra rows ride along nearly free; past it each row adds its own compute, which is what "
            "speculative verification, Jacobi windows and batching pay for here.")
