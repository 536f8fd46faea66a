"""Chapter 3 figures and the sentences that interpret them, written from the numbers so they stay true
whatever a run measures."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from studylib import plots
from studylib.workbook import illustration as ill


def _label(method: str) -> str:
    return method.replace("lookahead:", "LA ").replace("jacobi:", "Jacobi ")


def plot_speed(summary: pd.DataFrame) -> plt.Figure:
    """Compression and wall-clock speedup per workload and method, with 95% CI whiskers."""
    s = summary[summary.method != "ar"]
    methods = list(dict.fromkeys(s.method))
    workloads = list(dict.fromkeys(s.workload))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    width = 0.8 / max(len(methods), 1)
    pal = plots.palette(methods)  # the same colours as the cost-model figure
    for ax, (col, lo, hi, title) in zip(axes, [
        ("compression", "compression_lo", "compression_hi", "new tokens per target forward"),
        ("speedup", "speedup_lo", "speedup_hi", "wall-clock speedup over AR"),
    ], strict=True):
        for i, m in enumerate(methods):
            g = s[s.method == m].set_index("workload").reindex(workloads)
            x = np.arange(len(workloads)) + (i - (len(methods) - 1) / 2) * width
            err = np.vstack([g[col] - g[lo], g[hi] - g[col]])
            ax.bar(x, g[col], width, yerr=err, capsize=3, label=_label(m), color=pal[m])
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(workloads)), workloads)
        ax.set_title(title)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return plots.tidy(fig)


def explain_speed(summary: pd.DataFrame, headline: str) -> str:
    h = summary[summary.method == headline]
    if h.empty:
        return f"No rows for the headline method {headline!r}."
    n = int(h.prompts.min())
    if ill.is_illustration(n):
        return (f"**{_label(headline)}** commits {h.compression.min():.2f}-{h.compression.max():.2f} tokens per "
                f"target forward and runs at {h.speedup.min():.2f}-{h.speedup.max():.2f}x AR's wall-clock speed: "
                f"{ill.sentence(n, per='workload')}, so no interval is given and nothing is concluded about speed.")
    faster = h[h.speedup_lo > 1.0].workload.tolist()
    slower = h[h.speedup_hi < 1.0].workload.tolist()
    parts = [f"**{_label(headline)}** commits {h.compression.min():.2f}-{h.compression.max():.2f} tokens per "
             f"target forward and runs at {h.speedup.min():.2f}-{h.speedup.max():.2f}x AR's wall-clock speed."]
    if faster:
        parts.append(f"It is faster than AR, CI above 1, on {', '.join(faster)}.")
    if slower:
        parts.append(f"It is slower than AR, CI below 1, on {', '.join(slower)}: fewer forwards do not pay "
                     "for the extra tokens each forward carries on this machine (see the cost model).")
    exact = bool(summary.exact.all())
    parts.append("Every output was token-identical to AR." if exact else
                 "Some outputs differ from AR: the method is not lossless here (see the exact column).")
    return " ".join(parts)


def explain_runs(speed_runs: dict, headline: str) -> str:
    """The speed-up over whole runs, per workload, in one sentence (this is what the verdict judges)."""
    if not speed_runs:
        return "No whole runs were taken, so the speed-up has no CI over runs."
    n = min(e.n for e in speed_runs.values())
    cells = "; ".join(f"{w} {e.value:.2f}x [{e.ci_low:.2f}, {e.ci_high:.2f}] (runs {min(e.samples):.2f}-{max(e.samples):.2f})"
                      for w, e in speed_runs.items())
    return (f"Over {n} whole runs (fresh processes, the engine reloaded each time), {_label(headline)} runs at: "
            f"{cells}, as 95% CIs (t on the log of the run medians). The verdict judges the same runs at its "
            "corrected level with the declared drift between cold runs, so its CIs (in the verdict table) are wider; "
            "the table above gives one run's CIs over prompts, which cannot see how runs differ.")


def plot_sweep(sweep: pd.DataFrame, value: str = "speedup") -> plt.Figure:
    """One heat map of ``value`` over (W, N) per guess-set size G; an illustration's n in the titles."""
    gs = sorted(sweep.G.unique())
    fig, axes = plt.subplots(1, len(gs), figsize=(3.6 * len(gs) + 1, 3.2), squeeze=False)
    vmax = max(float(sweep[value].max()), 1.01)
    vmin = min(float(sweep[value].min()), 0.99)
    for ax, g in zip(axes[0], gs, strict=True):
        grid = sweep[sweep.G == g].pivot_table(index="N", columns="W", values=value)
        sns.heatmap(grid, annot=True, fmt=".2f", cmap="RdBu", center=1.0, vmin=vmin, vmax=vmax, ax=ax,
                    cbar=ax is axes[0][-1])
        ax.set_title(ill.title_for(f"{value}, G={g}", sweep))
        ax.invert_yaxis()
    fig.tight_layout()
    return plots.tidy(fig)


def explain_sweep(sweep: pd.DataFrame) -> str:
    n = int(sweep.prompts.min()) if "prompts" in sweep and len(sweep) else None
    if n is not None and ill.is_illustration(n):
        return (f"The sweep is {ill.sentence(n)}: the heat maps show what was measured on "
                f"{'that prompt' if n == 1 else 'those prompts'}, and no setting is picked from them.")
    by_c = sweep.loc[sweep.compression.idxmax()]
    by_s = sweep.loc[sweep.speedup.idxmax()]
    same = by_c.method == by_s.method
    text = (f"The highest compression comes from W={by_c.W}, N={by_c.N}, G={by_c.G} "
            f"({by_c.compression:.2f} new tokens per forward, each forward carrying "
            f"{by_c.tokens_per_forward:.0f} tokens); the best wall "
            f"clock from W={by_s.W}, N={by_s.N}, G={by_s.G} ({by_s.speedup:.2f}x AR, "
            f"{by_s.tokens_per_forward:.0f} tokens per forward).")
    if not same:
        text += (" They differ: on this machine a wider forward costs more than the extra accepted tokens "
                 "return, so the fastest setting is a narrower one than the one that accepts most.")
    return text


def plot_cost(cost: pd.DataFrame, curve: pd.DataFrame, gpu_curve: pd.DataFrame | None = None) -> plt.Figure:
    """Relative forward time t(T)/t(1) against T, with each method placed at (tokens per forward,
    compression): a method above the measured curve beats AR on this machine."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    ax.plot(curve["T"], curve["relative"], marker="o", color="black", label="this machine, measured")
    if "lo" in curve:
        base = float(curve.loc[curve["T"].idxmin(), "seconds"])
        ax.fill_between(curve["T"], curve["lo"] / base, curve["hi"] / base, color="black", alpha=0.15)
    if gpu_curve is not None:
        ax.plot(gpu_curve["T"], gpu_curve["relative"], ls="--", color="grey", label="H100 roofline (model)")
    pal = plots.palette(cost.method)
    for wl, marker in zip(dict.fromkeys(cost.workload), "osD^vP", strict=False):
        g = cost[cost.workload == wl]
        for r in g.itertuples():
            ax.scatter(r.tokens_per_forward, r.compression, marker=marker, s=45, color=pal[r.method],
                       edgecolor="black", linewidth=0.4)
        ax.scatter([], [], marker=marker, color="white", edgecolor="black", label=wl)
    for m, col in pal.items():
        ax.scatter([], [], marker="s", color=col, label=_label(m))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in one forward (T)")
    ax.set_ylabel("t(T) / t(1)   |   compression")
    ax.set_title("a method pays off when its compression sits above the cost curve")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    return plots.tidy(fig)


def explain_cost(cost: pd.DataFrame, curve: pd.DataFrame) -> str:
    t = curve.set_index("T").relative
    big = int(curve["T"].max())
    above = cost[cost.compression > cost.break_even]
    text = (f"On this machine a forward of {big} tokens costs {t.loc[big]:.1f}x a single-token forward "
            f"(and {t.iloc[len(t) // 2]:.1f}x at T={int(t.index[len(t) // 2])}), so parallel tokens are not free. ")
    if len(above):
        # the cost curve predicts a win; the wall clock decides it (per-step overheads outside the forward)
        won = int((above.speedup > 1).sum())
        text += (f"{len(above)} of {len(cost)} method/workload pairs accept more tokens per forward than the "
                 f"forward costs, so the cost curve predicts they beat AR; measured, {won} of them "
                 f"{'does' if won == 1 else 'do'} (median speed-up above 1); ")
    else:
        text += "No method/workload pair accepts more tokens per forward than the forward costs; "
    rel = float(((cost.predicted_speedup - cost.speedup).abs() / cost.speedup).median())
    text += (f"the cost model's predicted speedups are within a median {100 * rel:.0f}% of the measured ones"
             + (", so the curve explains the wall clock." if rel <= 0.2 else
                ", a loose fit: per-step overheads outside the forward (mask building, verification, "
                "a busy machine) also count."))
    if "gpu_roofline_speedup" in cost:
        text += (" On a GPU, where the same forward stays bandwidth-bound up to hundreds of tokens, the same "
                 f"compressions would give up to {cost.gpu_roofline_speedup.max():.2f}x (roofline model, not "
                 "measured here; the gpu profile measures it).")
    return text


def _cell_token(s: str, width: int = 10) -> str:
    """A token as its cell shows it: escapes visible, whole up to ``width`` characters, else cut with an ellipsis."""
    text = repr(s)[1:-1]
    return text if len(text) <= width else text[: width - 1] + "…"


def plot_trajectory(traj: pd.DataFrame, blocks: Sequence[int] = (0, 1)) -> plt.Figure:
    """Which block positions are right (light) and committed (dark) at each Jacobi iteration."""
    blocks = [b for b in blocks if b in set(traj.block)]
    width = max(5.5, 0.75 * int(traj.position.max() + 1)) if len(traj) else 5.5  # room for whole tokens
    fig, axes = plt.subplots(1, len(blocks), figsize=(width * len(blocks), 3.6), squeeze=False)
    for ax, b in zip(axes[0], blocks, strict=True):
        t = traj[traj.block == b]
        state = (t.correct.astype(int) + t.fixed.astype(int)).to_numpy()
        grid = pd.DataFrame({"it": t.iteration, "pos": t.position, "s": state}).pivot(
            index="it", columns="pos", values="s")
        text = pd.DataFrame({"it": t.iteration, "pos": t.position, "w": t.text.map(_cell_token)}
                            ).pivot(index="it", columns="pos", values="w")
        sns.heatmap(grid, annot=text, fmt="", cmap=sns.color_palette(["#f4cccc", "#c9e4f6", "#3d85c6"], 3),
                    vmin=0, vmax=2, cbar=False, ax=ax, linewidths=0.5, annot_kws={"fontsize": 7})
        ax.set_title(f"block {b}: red wrong, light right, dark committed")
        ax.set_xlabel("position in block")
        ax.set_ylabel("iteration")
    fig.tight_layout()
    return plots.tidy(fig)


def explain_trajectory(conv: pd.DataFrame, block: int) -> str:
    n = len(conv)
    iters = int((conv.groupby("block").committed.max()).sum()) if n else 0
    early = int((conv.first_correct < conv.committed).sum())
    text = (f"On this one prompt ({ill.sentence(1)}; it shows the mechanism), {n} positions in "
            f"{conv.block.nunique()} blocks of up to {block} took {iters} Jacobi iterations "
            f"({n / max(iters, 1):.2f} tokens per iteration; AR takes one per forward). ")
    if early:
        text += (f"{early} positions held the right token before they could be committed: they waited only for "
                 "the positions before them to settle. Such early agreement is all Jacobi decoding can gain from.")
    else:
        text += ("No position was right before its turn: each iteration fixed exactly the next token, AR's pace "
                 "at a block's cost. Jacobi decoding gains only when later guesses are right early, which is what "
                 "CLLMs fine-tune a model for (Kou et al. 2024).")
    return text
