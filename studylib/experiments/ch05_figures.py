"""Chapter 5 figures: throughput-latency curves, utilisation over time, and speculative vs. batching gains."""

from __future__ import annotations

import math

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter, NullFormatter

from studylib import plots

# EAGLE-3 in SGLang (Li et al. 2025): speculative throughput gain by batch size (LLaMA-3.1-8B, H100).
EAGLE3_SGLANG = {2: 1.81, 64: 1.38}


def _arm_palette(arms) -> dict[str, str]:
    # An arm keeps its scheduler's colour; the +radix variant gets a darker shade of it, and an arm that
    # speculates in the batch a lighter tint of the arm it adds the lookup to.
    out = {}
    for a in arms:
        parts = a.split("+")
        rgb = mcolors.to_rgb(plots.color(parts[0]))
        if "radix" in parts:
            rgb = tuple(c * 0.55 for c in rgb)
        if any(p.startswith("lookup") for p in parts):
            rgb = tuple(c + (1 - c) * 0.5 for c in rgb)
        out[a] = mcolors.to_hex(rgb)
    return out


def _plain(ax) -> None:
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def plot_tradeoff(curve: pd.DataFrame):
    """Throughput (x) vs. p99 TTFT and p99 TPOT (y), one line per arm, ordered by arrival rate."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    pal = _arm_palette(curve["arm"].unique())
    for arm, g in curve.groupby("arm", sort=False):
        g = g.assign(order=g["rate"].replace(math.inf, 1e12)).sort_values("order")
        style = "--" if "+radix" in arm else "-"
        for ax, y in zip(axes, ("ttft_p99_s", "tpot_p99_s"), strict=True):
            ax.plot(g["throughput_tok_s"], g[y], style, marker="o", ms=4, color=pal[arm], label=arm)
            sat = g[g["rate"] == math.inf]
            ax.scatter(sat["throughput_tok_s"], sat[y], s=70, facecolors="none", edgecolors=pal[arm])
    axes[0].set(xlabel="output tokens / s", ylabel="p99 TTFT (s)", yscale="log", title="Throughput vs. p99 TTFT")
    axes[1].set(xlabel="output tokens / s", ylabel="p99 TPOT (s)", title="Throughput vs. p99 TPOT")
    axes[1].legend(title="arm (circle = saturation)", fontsize="x-small")
    for ax in axes:
        _plain(ax)
    fig.tight_layout()
    return plots.tidy(fig)


def plot_utilisation(util: pd.DataFrame):
    """Running batch size, queue length and KV-pool use over time, one panel each, one line per arm."""
    if not len(util):
        return None
    names = {"batch_seqs": "sequences in the step", "waiting": "queue length", "kv_used": "KV budget in use"}
    util = util.assign(metric=util["metric"].map(names))
    g = sns.relplot(data=util, x="t", y="value", hue="arm", row="metric", kind="line", drawstyle="steps-pre",
                    palette=_arm_palette(util["arm"].unique()), height=1.9, aspect=4.2,
                    facet_kws={"sharey": False})
    g.set_titles(row_template="{row_name}")
    g.set_axis_labels("time since the first arrival (s)", "")
    return plots.tidy(g.figure)


def plot_c8(c8: pd.DataFrame):
    """Batching gain G(B) and speculative gain S(B) vs. batch size, with EAGLE-3's SGLang points."""
    fig, ax = plt.subplots(figsize=plots.FIGSIZE)
    ax.plot(c8["batch"], c8["batching_gain"], marker="o", color=plots.color("continuous"),
            label="batching: throughput vs. batch 1")
    ax.plot(c8["batch"], c8["speculative_gain"], marker="o", color=plots.color("speculative"),
            label="speculative: gain at this batch (ours, modelled)")
    ax.scatter(list(EAGLE3_SGLANG), list(EAGLE3_SGLANG.values()), marker="x", s=60, color="black",
               label="EAGLE-3 in SGLang (8B, H100)")
    ax.axhline(1.0, color="grey", lw=1, ls=":")
    ax.set(xscale="log", yscale="log", xlabel="batch size (sequences per step)", ylabel="gain (x)",
           title="Batching gain and speculative gain by batch size")
    _plain(ax)
    ax.legend(fontsize="x-small")
    return plots.tidy(fig)


def plot_capacity(probes: pd.DataFrame, slo: dict):
    """The capacity search's probes: p99 TTFT and p99 TPOT against the arrival rate, the SLO as lines."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    g = probes.sort_values("rate")
    for ax, y, key, title in zip(axes, ("ttft_p99_s", "tpot_p99_s"), ("ttft_s", "tpot_s"),
                                 ("p99 time to first token", "p99 time per output token"), strict=True):
        colors = ["#2a9d8f" if m else "#e76f51" for m in g["met"]]
        ax.plot(g["rate"], g[y], "-", color="0.6", zorder=1)
        ax.scatter(g["rate"], g[y], c=colors, s=40, zorder=2)
        ax.axhline(slo[key], ls="--", color="0.3", lw=1)
        # Headroom above the SLO line and its name just under it, at the left edge: placed above the line,
        # the name ran into the panel's title whenever every probe sat below the SLO.
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, max(hi, slo[key] + 0.15 * (slo[key] - lo)))
        # under the line, unless the line sits near the floor (then above it, still inside the axes)
        low = (slo[key] - lo) < 0.15 * (ax.get_ylim()[1] - lo)
        ax.annotate("SLO", (0.01, slo[key]), xycoords=ax.get_yaxis_transform(), textcoords="offset points",
                    xytext=(0, 3 if low else -3), va="bottom" if low else "top", fontsize="small")
        ax.set(xlabel="arrival rate (requests / s)", ylabel="seconds", title=title)
    axes[0].text(0.98, 0.95, "green: inside the SLO, red: outside", transform=axes[0].transAxes, va="top",
                 ha="right", fontsize="small")
    fig.suptitle(f"Capacity search, {g['arm'].iloc[0]}", fontsize="medium")
    fig.tight_layout()
    return plots.tidy(fig)
