"""Chapter 6 measurements, part 2: quality of sparse attention at long context on a real model.

Perplexity of long real text (``studylib.data.long_text``, via ``studylib.eval.perplexity``) under
each pattern's KV cache, greedy continuations compared with dense, and the quality-vs-KV-budget
frontier. The decode-mode measurements (documents, needle, time per token) are ``ch06_decode``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pandas as pd

from studylib import plots
from studylib.attention import Pattern, make_cache
from studylib.errors import StudylibError
from studylib.workbook.tables import span


def budget_specs(budgets: Sequence[int], kinds: Sequence[str] = ("window", "sinks", "blocksparse"),
                 sinks: int = 4) -> list[str]:
    """Pattern specs whose last query attends to about ``budget`` keys, one per kind and budget.

    Block-sparse uses blocks of budget/4 (a power of two >= 16): its own block, a local one, a
    global one and a random one; fewer when the budget holds fewer blocks.
    """
    out = []
    for b in budgets:
        for kind in kinds:
            if kind == "window":
                out.append(f"window:{b}")
            elif kind == "sinks":
                out.append(f"sinks:{sinks},{b - sinks}")
            elif kind == "blocksparse":
                block = max(16, 1 << max(4, int(np.log2(max(b // 4, 1)))))
                n = max(1, b // block)
                local, glob = max(1, n - 2), 1 if n >= 2 else 0
                rand = max(0, n - local - glob)
                out.append(f"blocksparse:block={block},local={local},global={glob},random={rand},seed=0")
            else:
                raise StudylibError(f"unknown pattern kind {kind!r}; use window, sinks or blocksparse.")
    return out


def long_context_quality(model, tokenizer, n_tokens: int, specs: Sequence[str], chunk: int = 256,
                         gen_tokens: int = 32, seed: int = 0, source: str = "narrativeqa",
                         progress: bool = True) -> dict:
    """Per pattern: per-token NLL of ``n_tokens`` of real text, then ``gen_tokens`` greedy tokens
    continuing it from the very cache the text built (so the continuation sees what the pattern kept)."""
    from studylib.data import long_text
    from studylib.eval.perplexity import perplexity
    from studylib.experiments.ch06_decode import decode_step, greedy_tokens
    from studylib.progress import progress_bar

    if n_tokens + gen_tokens > model.config.max_position_embeddings:
        raise StudylibError(f"n_tokens + gen_tokens = {n_tokens + gen_tokens} exceeds the model's context of "
                            f"{model.config.max_position_embeddings}; lower n_tokens.")
    ids = long_text(tokenizer, n_tokens, seed=seed, source=source)
    runs = {}
    for spec in progress_bar(["dense", *[s for s in specs if s != "dense"]], desc="long-context quality", progress=progress):
        holder = {}

        def factory(cfg, max_len, device, dtype, spec=spec, holder=holder):
            holder["cache"] = make_cache(spec, cfg, max_len + gen_tokens, device, dtype)
            return holder["cache"]

        t0 = time.perf_counter()
        res = perplexity(model, ids, chunk=chunk, kv_factory=factory)
        cache = holder["cache"]
        cont = greedy_tokens(model, cache, decode_step(model, cache, ids[-1]), gen_tokens)
        runs[spec] = {"ppl": res.ppl, "nll": res.token_nll.numpy(), "continuation": cont,
                      "seconds": time.perf_counter() - t0}
    return {"n_tokens": n_tokens, "source": source, "seed": seed, "chunk": chunk, "runs": runs}


def _ratio_ci(d: np.ndarray, block: int = 64, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% CI of exp(mean d) by a moving-block bootstrap (neighbouring tokens' losses are correlated)."""
    n = len(d)
    if n < 2 * block:
        block = max(1, n // 4)
    starts = np.arange(n - block + 1)
    k = int(np.ceil(n / block))
    rng = np.random.default_rng(seed)
    idx = (rng.choice(starts, size=(n_boot, k))[:, :, None] + np.arange(block)).reshape(n_boot, -1)[:, :n]
    boots = np.exp(d[idx].mean(1))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(lo), float(hi)


def quality_summary(result: dict) -> pd.DataFrame:
    """One row per pattern: KV budget, perplexity ratio vs dense (block-bootstrap CI), greedy agreement."""
    runs, T = result["runs"], result["n_tokens"]
    dense = runs["dense"]
    rows = []
    for spec, r in runs.items():
        p = Pattern.parse(spec)
        d = r["nll"] - dense["nll"]
        lo, hi = _ratio_ci(d) if spec != "dense" else (1.0, 1.0)
        same = [a == b for a, b in zip(r["continuation"], dense["continuation"], strict=True)]
        first = same.index(False) if False in same else len(same)
        rows.append({"pattern": spec, "kind": p.kind, "kv_budget": p.kv_budget(T),
                     "budget_frac": p.kv_budget(T) / T, "mean_keys": p.visible_pairs(T) / T, "ppl": r["ppl"],
                     "ppl_ratio": float(np.exp(d.mean())), "ppl_ratio_low": lo, "ppl_ratio_high": hi,
                     "agreement": float(np.mean(same)), "first_divergence": first, "seconds": r["seconds"]})
    return pd.DataFrame(rows)


def plot_frontier(summary: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    pal = plots.palette(sorted(summary[summary.kind != "dense"].kind.unique()))
    for kind, g in summary[summary.kind != "dense"].groupby("kind"):
        g = g.sort_values("budget_frac")
        err = [g.ppl_ratio - g.ppl_ratio_low, g.ppl_ratio_high - g.ppl_ratio]
        ax.errorbar(g.budget_frac, g.ppl_ratio, yerr=err, marker="o", capsize=3, label=kind, color=pal[kind])
    ax.axhline(1.01, color="grey", ls=":", lw=1)
    ax.annotate("1% worse than dense", (ax.get_xlim()[0], 1.01), textcoords="offset points", xytext=(4, 3),
                fontsize="x-small", color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV budget of the last query / context length")
    ax.set_ylabel("perplexity / dense perplexity")
    ax.set_title("Quality vs KV budget")
    ax.legend()
    return plots.tidy(fig)


def plot_nll_gap(result: dict, smooth: int = 128):
    """Rolling mean of (pattern NLL - dense NLL) against position: where the pattern starts to lose."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    dense = result["runs"]["dense"]["nll"]
    # each pattern in its family's colour, two of one family in two shades of it
    pal = plots.family_palette([s for s in result["runs"] if s != "dense"], lambda s: Pattern.parse(s).kind)
    for spec, r in result["runs"].items():
        if spec == "dense":
            continue
        gap = pd.Series(r["nll"] - dense).rolling(smooth, min_periods=1).mean()
        ax.plot(np.arange(1, len(gap) + 1), gap, label=spec, color=pal[spec], lw=1)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("position in the text (tokens)")
    ax.set_ylabel(f"NLL gap vs dense (nats, mean of {smooth})")
    ax.set_title("Where sparse attention loses information")
    ax.legend(fontsize="x-small")
    return plots.tidy(fig)


def explain_quality(summary: pd.DataFrame) -> str:
    sp = summary[summary.kind != "dense"].sort_values("ppl_ratio")
    if sp.empty:
        return "No sparse pattern was measured."
    best, worst = sp.iloc[0], sp.iloc[-1]
    within = sp[sp.ppl_ratio <= 1.01]
    s = (f"Best: {best.pattern} at {best.ppl_ratio:.4f}x dense perplexity ({best.budget_frac:.0%} of the context "
         f"as KV budget); worst: {worst.pattern} at {worst.ppl_ratio:.4f}x. "
         f"{len(within)} of {len(sp)} patterns {'stays' if len(within) == 1 else 'stay'} within 1% of dense. Greedy continuations match dense on "
         f"{span(sp.agreement.min(), sp.agreement.max())} of tokens.")
    return s


def explain_frontier(summary: pd.DataFrame) -> str:
    parts = []
    for kind, g in summary[summary.kind != "dense"].groupby("kind"):
        ok = g[g.ppl_ratio <= 1.01].sort_values("budget_frac")
        if len(ok):
            parts.append(f"{kind} stays within 1% from a budget of {ok.budget_frac.iloc[0]:.0%} of the context")
        else:
            best = g.sort_values("ppl_ratio").iloc[0]
            parts.append(f"{kind} never gets within 1% at the budgets measured (best {best.ppl_ratio:.3f}x at "
                         f"{best.budget_frac:.0%})")
    return ("; ".join(parts) + ".") if parts else "No sparse pattern was measured."
