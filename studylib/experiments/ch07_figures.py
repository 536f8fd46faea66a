"""Chapter 7's figures: every arm against the baseline, the waterfall of the best stack, and the
three interaction curves of claim C8. Speedups are drawn on a log2 axis labelled in "x", so a halving
and a doubling look alike."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from studylib import plots
from studylib.experiments import ch07_combined as cc
from studylib.experiments.ch07_report import LATENCY_BAR


def colour(name: str) -> str:
    """A technique keeps the colour the other chapters give it (the prefix cache, which has none in
    the shared palette, gets a fixed one); a stack takes its decoder's colour and is hatched."""
    from studylib import plots

    parts = [p.split(" (")[0] for p in name.split(" + ")]
    key = next((p for p in reversed(parts) if p != cc.WINDOW), parts[-1]) if len(parts) > 1 else parts[0]
    return plots.color({cc.WINDOW: "window"}.get(key, key))


def hatch(name: str) -> str | None:
    return "//" if " + " in name else None


def _log2_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{2 ** y:.3g}x"))


def plot_speedups(summary: pd.DataFrame, target: float = LATENCY_BAR):
    """Every arm's e2e speedup over AR per workload, with 95% CIs (log scale)."""
    import matplotlib.pyplot as plt


    arms = [a for a in dict.fromkeys(summary.arm) if a != cc.BASELINE]
    wls = list(dict.fromkeys(summary.workload))
    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    width = 0.8 / max(len(arms), 1)
    for j, arm in enumerate(arms):
        s = summary[summary.arm == arm].set_index("workload").reindex(wls)
        x = np.arange(len(wls)) + (j - (len(arms) - 1) / 2) * width
        y = np.log2(s.speedup)
        err = [y - np.log2(s.speedup_low), np.log2(s.speedup_high) - y]
        ax.bar(x, y, width, color=colour(arm), hatch=hatch(arm), edgecolor="white", label=arm)
        ax.errorbar(x, y, yerr=err, fmt="none", ecolor="black", lw=0.8, capsize=2)
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(math.log2(target), color="grey", ls="--", lw=0.8, label=f"claimed {target:g}x")
    ax.set_xticks(range(len(wls)), wls)
    ax.set(ylabel="e2e speedup vs AR", title="Each technique, and the stack, against the AR baseline")
    _log2_axis(ax)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return plots.tidy(ax)


def plot_waterfall(wf: pd.DataFrame, target: float = LATENCY_BAR):
    """Per workload, the stack's log speedup split into the steps that built it (bars add up exactly
    to the diamond, the stack's speedup)."""
    import matplotlib.pyplot as plt


    fig, ax = plt.subplots(figsize=(8.0, 3.8))
    seen: set[str] = set()
    wls = list(dict.fromkeys(wf.workload))
    for i, wl in enumerate(wls):
        bottom = 0.0
        for r in wf[wf.workload == wl].itertuples():
            h = math.log2(r.factor)
            ax.bar(i, h, bottom=bottom, width=0.6, color=colour(r.added), edgecolor="white",
                   label=None if r.added in seen else r.added)
            seen.add(r.added)
            bottom += h
        ax.plot(i, bottom, marker="D", color="black", ms=6, label=None if "total" in seen else "stack total")
        seen.add("total")
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(math.log2(target), color="grey", ls="--", lw=0.8, label=f"claimed {target:g}x")
    ax.set_xticks(range(len(wls)), wls)
    ax.set(ylabel="speedup vs AR (log)", title="What each technique adds to the stack")
    _log2_axis(ax)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return plots.tidy(ax)


def plot_interactions(spec_gain: pd.DataFrame, prefix_curve: pd.DataFrame, sparse: pd.DataFrame):
    """Three panels: speculative gain vs batch, prefix-cache e2e gain vs output length, sparse gain vs
    context (all vs their own baseline; 1x dashed)."""
    import matplotlib.pyplot as plt

    from studylib import plots

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.3))
    panels = [(spec_gain, "batch", "gain", "gain_low", "gain_high", "speculative", "batch size",
               "speculative vs batch"),
              (prefix_curve, "output_tokens", "speedup", "low", "high", "studylib", "output tokens",
               "prefix cache vs output length"),
              (sparse, "context", "speedup", "low", "high", "window", "context tokens", "sparse attention vs context")]
    for ax, (df, x, y, lo, hi, c, xl, title) in zip(axes, panels, strict=True):
        if df is None or not len(df):
            ax.set_axis_off()
            continue
        ax.plot(df[x], df[y], marker="o", color=plots.color(c))
        ax.fill_between(df[x], df[lo], df[hi], color=plots.color(c), alpha=0.2)
        ax.axhline(1.0, color="grey", ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set(xlabel=xl, ylabel="speedup (x)", title=title)
    fig.tight_layout()
    return plots.tidy(axes)
