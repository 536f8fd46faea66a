"""Chapter 6 measurements, part 3: attention where decoding happens, one token at a time.

Quest selects per decode step, so its quality, speed and recall must be read in decode mode, and the
other patterns are read the same way beside it:

- ``decode_cost``: the real model's time per decoded token against context length, per pattern, with
  the K/V bytes a step reads (the cache is filled with random keys: a step's work depends on how many
  keys it reads, not on their values; Quest reads its full budget whatever the keys).
- ``document_quality``: per independent document of real text, the context is prefilled, then the
  last ``scored`` tokens are teacher-forced (each position reading what its own decode step would)
  and compared with dense (perplexity
  ratio, KL, top-1) at exactly the positions where the patterns differ from dense; then a greedy
  continuation is compared with dense's.
- ``needle_grid``: a code hidden at a given depth of a real-text haystack; the question is fed token
  by token, the answer generated greedily, per pattern.

Arms whose prefill is dense (dense itself, Quest) share one prefill per text: Quest copies it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from studylib import plots
from studylib.attention import Pattern, make_cache
from studylib.attention.quest import QuestKVCache
from studylib.bench.stats import estimate, ratio_estimate, rotated
from studylib.errors import StudylibError
from studylib.models import DenseKVCache
from studylib.workbook import illustration as ill


@torch.inference_mode()
def prefill_arms(model, ids: Sequence[int], specs: Sequence[str], extra: int, chunk: int = 512) -> dict:
    """One cache per pattern holding ``ids`` (capacity len(ids) + extra). Dense-prefill patterns share
    one dense prefill (Quest copies it and summarises its pages); the others prefill under their pattern."""
    cfg, dev, dt = model.config, model.device, model.dtype
    x = torch.as_tensor(list(ids), device=dev)[None]
    T = x.shape[1]
    cap = T + extra
    if cap > cfg.max_position_embeddings:
        raise StudylibError(f"{T} tokens + {extra} more exceed the model's context of {cfg.max_position_embeddings}.")

    def fill(cache):
        for s in range(0, T, chunk):
            n = min(chunk, T - s)
            model(x[:, s:s + n], cache.begin(n), logits="last")
        return cache

    kinds = {s: Pattern.parse(s).kind for s in specs}
    caches = {}
    if any(k in ("dense", "quest") for k in kinds.values()):
        dense = fill(DenseKVCache(cfg, 1, cap, dev, dt))
        for spec, kind in kinds.items():
            if kind == "quest":  # copied before dense decodes on: both start from the same prefill
                caches[spec] = make_cache(spec, cfg, cap, dev, dt).copy_from(dense)
            elif kind == "dense":
                caches[spec] = dense
    for spec, kind in kinds.items():
        if kind not in ("dense", "quest"):
            caches[spec] = fill(make_cache(spec, cfg, cap, dev, dt))
    return {s: caches[s] for s in specs}


@torch.inference_mode()
def decode_step(model, cache, token: int) -> torch.Tensor:
    """One decode step: feed ``token``, return the next-token logits (V,) in fp32."""
    x = torch.tensor([[token]], device=model.device)
    return model(x, cache.begin(1), logits="last").logits[0, -1].float()


class CacheRows:
    """Several single-sequence caches behind one forward of as many rows: row i attends through
    ``caches[i]``. Arms that feed the same tokens (the Quest budgets, teacher-forced over one document)
    then read the weights once per step for all of them instead of once each; every row still attends
    only through its own cache, so each arm's attention is its own."""

    def __init__(self, caches: Sequence):
        self.caches = list(caches)

    def begin(self, n: int) -> CacheRows:
        for c in self.caches:
            c.begin(n)
        return self

    def positions(self) -> torch.Tensor:
        return torch.cat([c.positions() for c in self.caches], 0)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([c.attend(layer, q[i:i + 1], k[i:i + 1], v[i:i + 1]) for i, c in enumerate(self.caches)], 0)


@torch.inference_mode()
def decode_rows(model, caches: Sequence, tokens: Sequence[int]) -> torch.Tensor:
    """Feed ``tokens`` one decode step at a time to every cache in ``caches`` at once (one row each,
    ``CacheRows``); returns the next-token logits (len(caches), len(tokens), V) in fp32."""
    rows = CacheRows(caches)
    out = []
    for t in tokens:
        x = torch.full((len(rows.caches), 1), int(t), device=model.device)
        out.append(model(x, rows.begin(1), logits="last").logits[:, -1].float())
    return torch.stack(out, 1)


def teacher_forceable(spec: str) -> bool:
    """Whether a Quest pattern's per-step selections over a known text can be made in one forward
    (``QuestKVCache.begin_teacher_forced``): when its recent window is at least a page."""
    p = Pattern.parse(spec)
    return p.kind == "quest" and p.recent >= p.page


def greedy_tokens(model, cache, logits: torch.Tensor, n: int) -> list[int]:
    """``n`` greedy tokens continuing from next-token ``logits``, each fed back through ``cache``."""
    out = []
    for i in range(n):
        out.append(int(logits.argmax()))
        if i + 1 < n:  # the last token needs no forward of its own
            logits = decode_step(model, cache, out[-1])
    return out


# --------------------------------------------------------------------------------------------------
# Time per decoded token
# --------------------------------------------------------------------------------------------------
@torch.inference_mode()
def _random_cache(spec: str, cfg, T: int, extra: int, device, dtype, seed: int):
    """A cache for ``spec`` holding T tokens of random K/V, as if T tokens had been decoded."""
    g = torch.Generator().manual_seed(seed)
    cache = make_cache(spec, cfg, T + extra, device, dtype)
    for s in range(0, T, 1024):
        n = min(1024, T - s)
        view = cache.begin(n)
        if isinstance(cache, DenseKVCache):  # every slot kept: write the slots directly
            for layer in range(cfg.num_layers):
                for buf in (cache.k[layer], cache.v[layer]):
                    buf[:, :, s:s + n] = torch.randn(1, cfg.num_kv_heads, n, cfg.head_dim, generator=g).to(device, dtype)
                if isinstance(cache, QuestKVCache):
                    cache._summarise(layer, s, s + n)
            continue
        q = torch.zeros(1, cfg.num_heads, n, cfg.head_dim, device=device, dtype=dtype)
        for layer in range(cfg.num_layers):  # an evicting cache decides what it keeps as it is fed
            k, v = (torch.randn(1, cfg.num_kv_heads, n, cfg.head_dim, generator=g).to(device, dtype) for _ in range(2))
            view.attend(layer, q, k, v)
    return cache


def decode_cost(model, lengths: Sequence[int], specs: Sequence[str], repeats: int = 5, steps: int = 8,
                seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """Milliseconds per decoded token of the whole model at each context length, per pattern.

    Each repeat times ``steps`` consecutive steps for every (length, pattern) in an order that rotates
    per repeat, then rolls the caches back, so the repeats are the units of the CIs. ``kv_read_mb`` is
    the K/V one step reads (Quest: its selection plus one summary per page; dense layers all of it).
    """
    from studylib.progress import progress_bar

    cfg, dev, dt = model.config, model.device, model.dtype
    specs = ["dense", *[s for s in specs if s != "dense"]]
    if max(lengths) + steps > cfg.max_position_embeddings:
        raise StudylibError(f"decode_cost: {max(lengths)} + {steps} steps exceed the model's context of "
                            f"{cfg.max_position_embeddings}; lower the longest length.")
    from studylib.attention import SinkKVCache

    per_token_layer = cfg.kv_bytes_per_token(torch.finfo(dt).bits // 8) / cfg.num_layers
    jobs = [(T, s) for T in lengths for s in specs]
    rows = []
    for T in progress_bar(list(lengths), desc="decode cost", progress=progress):
        caches = {}
        for s in specs:
            # An evicting cache cannot roll back (what it dropped is gone), so it runs on through every
            # repeat; it holds S + W - 1 keys from any length on, so it is filled only as far as the
            # model's context leaves room for all the steps.
            grows = Pattern.parse(s).kind == "sinks"  # make_cache gives sinks the evicting cache
            fill = min(T, cfg.max_position_embeddings - steps * (repeats + 1)) if grows else T
            caches[s] = _random_cache(s, cfg, fill, steps * (repeats + 1) if grows else steps, dev, dt, seed + T)
        for s in specs:  # warm-up
            decode_step(model, caches[s], 5)
            if not isinstance(caches[s], SinkKVCache):
                caches[s].truncate(T)
        for r in range(repeats):
            for _, spec in rotated([j for j in jobs if j[0] == T], r):
                cache = caches[spec]
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                for i in range(steps):
                    decode_step(model, cache, 5 + i)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) / steps * 1e3
                if not isinstance(cache, SinkKVCache):
                    cache.truncate(T)
                p = Pattern.parse(spec)
                rows.append({"pattern": spec, "kind": p.kind, "seq_len": T, "rep": r, "ms_per_token": ms,
                             "kv_read_mb": p.read_tokens(T + steps // 2, cfg.num_layers) * per_token_layer / 2**20,
                             "kv_held_mb": cache.nbytes / 2**20})
        del caches
    return pd.DataFrame(rows)


def decode_speedup(dc: pd.DataFrame, seq_len: int, spec: str) -> dict:
    """Dense ms per token / the pattern's, paired by repeat, at ``seq_len``: the estimate and its CI."""
    d = dc[(dc.pattern == "dense") & (dc.seq_len == seq_len)].sort_values("rep")
    s = dc[(dc.pattern == spec) & (dc.seq_len == seq_len)].sort_values("rep")
    if d.empty or len(d) != len(s):
        est = estimate([])
    else:
        est = ratio_estimate(d["ms_per_token"].to_numpy(), s["ms_per_token"].to_numpy(), units=d["rep"].to_numpy())
    return {"pattern": spec, "seq_len": seq_len, "value": est.value, "ci_low": est.ci_low, "ci_high": est.ci_high,
            "n": est.n, "estimate": est}


def decode_summary(dc: pd.DataFrame) -> pd.DataFrame:
    """Per pattern and length: median ms per token (CI over repeats), speed-up over dense, K/V read."""
    rows = []
    for (spec, T), g in dc.groupby(["pattern", "seq_len"], sort=False):
        e = estimate(g["ms_per_token"], units=g["rep"])
        sp = decode_speedup(dc, T, spec) if spec != "dense" else {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0}
        rows.append({"pattern": spec, "context": T, "ms_per_token": e.value, "ms_low": e.ci_low, "ms_high": e.ci_high,
                     "speedup_vs_dense": sp["value"], "speedup_low": sp["ci_low"], "speedup_high": sp["ci_high"],
                     "kv_read_mb": float(g["kv_read_mb"].median()), "kv_held_mb": float(g["kv_held_mb"].median()),
                     "repeats": e.n})
    return pd.DataFrame(rows)


def plot_decode_cost(dc: pd.DataFrame):
    import matplotlib.pyplot as plt
    import seaborn as sns

    from studylib import plots

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    pal = plots.family_palette(dc["pattern"].unique(), lambda s: Pattern.parse(s).kind)
    sns.lineplot(dc, x="seq_len", y="ms_per_token", hue="pattern", palette=pal, marker="o", errorbar=("pi", 100),
                 ax=axes[0])
    read = dc.groupby(["pattern", "seq_len"], as_index=False)["kv_read_mb"].median()
    sns.lineplot(read, x="seq_len", y="kv_read_mb", hue="pattern", palette=pal, marker="o", ax=axes[1], legend=False)
    for ax, title, ylabel in zip(axes, ("time per decoded token (ms), whole model", "K/V read per decode step (MiB)"),
                                 ("ms per token", "MiB"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    axes[0].set_ylim(bottom=0)
    fig.tight_layout()
    plots.legend_below(fig, axes[0])
    return plots.tidy(fig)


def explain_decode_cost(summary: pd.DataFrame) -> str:
    T = summary["context"].max()
    at = summary[summary.context == T]
    dense = at[at.pattern == "dense"]
    if dense.empty:
        return "Dense decoding was not timed."
    d = dense.iloc[0]
    parts = []
    for r in at[at.pattern != "dense"].itertuples():
        parts.append(f"{r.pattern} {r.ms_per_token:.1f} ms ({r.speedup_vs_dense:.2f}x, 95% CI over {r.repeats} "
                     f"repeats in this process {r.speedup_low:.2f}-{r.speedup_high:.2f}; reads {r.kv_read_mb:.3g} "
                     f"MiB of K/V)")
    lo = summary[(summary.pattern == "dense")].sort_values("context").iloc[0]
    return (f"At {T} tokens of context dense decoding takes {d.ms_per_token:.1f} ms per token and reads "
            f"{d.kv_read_mb:.3g} MiB of K/V per step (at {lo.context} tokens: {lo.ms_per_token:.1f} ms). "
            + "; ".join(parts) + ". The rest of each step is the weights, the same for every pattern: "
            "attention can save at most the gap between dense and the shortest context. This sweep runs in one "
            "process on random caches; the verdict reads the same speed-up over whole runs (fresh processes), "
            "at its corrected level, so its value and interval differ a little from these.")


# --------------------------------------------------------------------------------------------------
# Quality at long context, in decode mode
# --------------------------------------------------------------------------------------------------
def document_quality(model, tokenizer, specs: Sequence[str], n_docs: int, n_tokens: int, scored: int = 32,
                     gen_tokens: int = 16, chunk: int = 512, source: str = "narrativeqa",
                     progress: bool = True) -> pd.DataFrame:
    """Per document (``long_text`` with its own seed: the units of the CIs) and pattern.

    The first ``n_tokens - scored`` tokens are prefilled; the last ``scored`` are then fed as one chunk
    to dense and the fixed-mask arms (the same numbers as step by step: a fixed mask gives each position
    the same keys either way) and to Quest, each position reading its own decode step's selection
    (``teacher_forceable``; a Quest with recent < page is fed one step at a time, ``decode_rows``). Each
    position's next-token distribution is compared with dense's: perplexity ratio over those positions,
    mean KL(dense || pattern) and top-1 agreement; and every word of the scored text is a task item
    (``studylib.eval.lastword``: the word predicted greedily, all its tokens right), kept per document as
    the paired arrays the task ratio is computed from. Then ``gen_tokens`` greedy tokens continue the
    text: compared with dense's continuation, and timed (ms per decoded token at ``n_tokens`` of context,
    arms in an order that rotates per document), which is the speed the verdict reads: one real
    document, one unit. Every scored position lies past each pattern's budget when ``n_tokens - scored``
    exceeds it, so the figures count only positions where a pattern can differ from dense.
    """
    from studylib.data import long_text
    from studylib.eval import lastword
    from studylib.progress import progress_bar

    if scored < 2 or scored >= n_tokens:
        raise StudylibError(f"document_quality needs 2 <= scored < n_tokens; got scored={scored}, n_tokens={n_tokens}.")
    specs = ["dense", *[s for s in specs if s != "dense"]]
    rows = []
    for doc in progress_bar(range(n_docs), desc="quality per document (decode)", progress=progress):
        ids = long_text(tokenizer, n_tokens, seed=1000 + doc, source=source)
        ctx, tail = ids[: n_tokens - scored], ids[n_tokens - scored:]
        caches = prefill_arms(model, ctx, specs, scored + gen_tokens, chunk)
        spans = lastword.word_spans(tokenizer, tail, min_context=1)
        logp, cont, words, ms = {}, {}, {}, {}
        x = torch.tensor([tail], device=model.device)
        # Quest selects per decode step. With recent >= page each position's selection can be made in one
        # teacher-forced forward (QuestKVCache.begin_teacher_forced: the tests hold it to stepping);
        # otherwise its arms are fed the tail one token at a time, all such budgets in one forward of one
        # row each (the same tokens, each row through its own cache)
        stepwise = [sp for sp in caches if Pattern.parse(sp).kind == "quest" and not teacher_forceable(sp)]
        stepped = (dict(zip(stepwise, decode_rows(model, [caches[sp] for sp in stepwise], tail), strict=True))
                   if stepwise else {})
        for spec in rotated(list(caches), doc):
            cache = caches[spec]
            if spec in stepped:
                logits = stepped[spec]
            else:  # a fixed mask gives every position the same keys in one chunk as one step at a time
                begin = cache.begin_teacher_forced if teacher_forceable(spec) else cache.begin
                with torch.inference_mode():
                    logits = model(x, begin(len(tail)), logits="all").logits[0].float()
            logp[spec] = F.log_softmax(logits[:-1], -1)  # predictions of tail[1:]
            words[spec] = lastword.score_logits(logits.argmax(-1), tail, spans)
            t0 = time.perf_counter()
            cont[spec] = greedy_tokens(model, cache, logits[-1], gen_tokens)
            ms[spec] = (time.perf_counter() - t0) * 1e3 / max(gen_tokens - 1, 1)
        y = torch.tensor(tail[1:], device=logp["dense"].device)[:, None]
        ref = logp["dense"]
        nll_ref = -ref.gather(1, y)[:, 0]
        for spec in specs[1:]:
            lp = logp[spec]
            nll = -lp.gather(1, y)[:, 0]
            rows.append({"document": doc, "pattern": spec, "tokens": n_tokens, "scored": scored - 1,
                         "ppl_ratio": float(torch.exp((nll - nll_ref).mean())),
                         "kl": float((ref.exp() * (ref - lp)).sum(-1).mean()),
                         "top1": float((ref.argmax(-1) == lp.argmax(-1)).float().mean()),
                         "greedy_agreement": float(np.mean([a == b for a, b in zip(cont[spec], cont["dense"],
                                                                                   strict=True)])),
                         "words": len(spans), "correct": words[spec].tolist(), "correct_dense": words["dense"].tolist(),
                         "ms_per_token": ms[spec], "ms_per_token_dense": ms["dense"],
                         "chance": lastword.chance_score(spans, model.config.vocab_size)})
    return pd.DataFrame(rows)


def document_summary(docs: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Per pattern: the next-word task ratio to dense (CI resampling documents, with its power), the decode
    speed-up over dense at the documents' length (paired by document), the median perplexity ratio with
    its CI, median KL, top-1 and greedy agreement. ``confidence``: the CIs' level (corrected when several
    configurations compete for one decision)."""
    from studylib.eval import lastword

    rows = []
    for spec, g in docs.groupby("pattern", sort=False):
        e = estimate(g["ppl_ratio"], confidence=confidence)
        task = lastword.paired_ratio([np.asarray(c, bool) for c in g["correct_dense"]],
                                     [np.asarray(c, bool) for c in g["correct"]], confidence=confidence,
                                     chance=float(g["chance"].mean()))
        speed = ratio_estimate(g["ms_per_token_dense"].to_numpy(), g["ms_per_token"].to_numpy(),
                               confidence=confidence)
        rows.append({"pattern": spec, "documents": e.n, "task_ratio": task.value, "task_low": task.ci_low,
                     "task_high": task.ci_high, "reference_score": task.reference_score, "mdc": task.mdc,
                     "has_power": task.has_power, "n_needed": task.n_needed, "words": task.items,
                     "speedup": speed.value, "speedup_low": speed.ci_low, "speedup_high": speed.ci_high,
                     "ppl_ratio": e.value, "ppl_ratio_low": e.ci_low,
                     "ppl_ratio_high": e.ci_high, "kl_nats": float(g["kl"].median()),
                     "top1_agreement": float(g["top1"].median()),
                     "greedy_agreement": float(g["greedy_agreement"].median()), "estimate": e,
                     "task": task, "speed_estimate": speed, "confidence": confidence})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# Needle in a haystack
# --------------------------------------------------------------------------------------------------
QUESTION = "\n\nQuestion: what is the secret code?\nAnswer: The secret code is"


def needle_grid(model, tokenizer, specs: Sequence[str], lengths: Sequence[int], depths: Sequence[float],
                seeds: Sequence[int] = (0,), gen_tokens: int = 8, chunk: int = 512, source: str = "xsum",
                progress: bool = True) -> pd.DataFrame:
    """Hide "The secret code is NNNNN." at ``depth`` (0 = start, 1 = end) of a real-text haystack of
    about ``length`` tokens, then ask for it. The haystack is prefilled; the question is fed one decode
    step at a time (where Quest selects) and the answer generated greedily. ``reachable`` says whether a
    static pattern's last query can see the needle at all (None for Quest: its choice depends on the query)."""
    from studylib.data import long_text
    from studylib.progress import progress_bar

    specs = ["dense", *[s for s in specs if s != "dense"]]
    question = list(tokenizer(QUESTION)["input_ids"])
    jobs = [(L, d, s) for L in lengths for d in depths for s in seeds]
    rows = []
    for L, depth, seed in progress_bar(jobs, desc="needle in a haystack", progress=progress):
        code = str(random.Random(seed * 7919 + L).randint(10000, 99999))
        needle = list(tokenizer(f" The secret code is {code}. ")["input_ids"])
        n_hay = L - len(needle) - len(question)
        if n_hay < 1:
            raise StudylibError(f"a haystack of {L} tokens cannot hold the needle and question; use more tokens.")
        hay = long_text(tokenizer, n_hay, seed=2000 + seed, source=source)
        pos = int(round(depth * n_hay))
        ctx = hay[:pos] + needle + hay[pos:]
        caches = prefill_arms(model, ctx, specs, len(question) + gen_tokens, chunk)
        end = len(ctx) + len(question) - 1  # the last question token's position
        for spec, cache in caches.items():
            for t in question[:-1]:
                decode_step(model, cache, t)
            answer = tokenizer.decode(greedy_tokens(model, cache, decode_step(model, cache, question[-1]), gen_tokens))
            p = Pattern.parse(spec)
            reach = None if p.kind == "quest" else bool(
                p.mask(torch.tensor([end]), torch.arange(pos, pos + len(needle))).all())
            rows.append({"pattern": spec, "kind": p.kind, "length": len(ctx) + len(question), "depth": depth,
                         "seed": seed, "distance": end - pos, "reachable": reach,
                         "found": code in answer.replace(" ", ""), "code": code, "answer": answer.strip()[:40]})
    return pd.DataFrame(rows)


def _trials_per_cell(needle: pd.DataFrame, by: Sequence[str] = ("pattern", "length")) -> int:
    """The fewest trials (each its own haystack and depth) behind one cell of the grid."""
    return int(needle.groupby(list(by)).size().min()) if len(needle) else 0


def needle_summary(needle: pd.DataFrame) -> pd.DataFrame:
    """Share of trials answered per pattern and haystack length (trials = depths x seeds); below
    ``MIN_UNITS`` trials per cell an illustration (``studylib.workbook.illustration``), labelled with n."""
    g = needle.groupby(["pattern", "length"], sort=False)["found"]
    return ill.illustration(g.agg(found="mean", trials="size").reset_index(), _trials_per_cell(needle), "trials",
                            per="cell")


def plot_needle(needle: pd.DataFrame):
    import matplotlib.pyplot as plt
    import seaborn as sns

    specs = list(dict.fromkeys(needle["pattern"]))
    fig, axes = plt.subplots(1, len(specs), figsize=(2.6 * len(specs) + 1, 2.8), sharey=True, squeeze=False)
    for ax, spec in zip(axes[0], specs, strict=True):
        g = needle[needle.pattern == spec].groupby(["depth", "length"])["found"].mean().unstack("length")
        sns.heatmap(g, vmin=0, vmax=1, cmap="RdYlGn", annot=True, fmt=".0%", cbar=False, ax=ax)
        ax.set_title(spec, fontsize="small")
        ax.set_xlabel("haystack (tokens)")
        ax.set_ylabel("needle depth" if ax is axes[0][0] else "")
    fig.suptitle(ill.title("Needle found (share of seeds)", _trials_per_cell(needle, ("pattern", "depth", "length")),
                           "trials", per="cell"), fontsize="medium")
    fig.tight_layout()
    return plots.tidy(fig)


def explain_needle(needle: pd.DataFrame) -> str:
    """The counts, in words; below ``MIN_UNITS`` trials per cell they are labelled an illustration and nothing
    is concluded from them."""
    dense = needle[needle.pattern == "dense"]
    n = _trials_per_cell(needle)
    if len(needle) and ill.is_illustration(n, "trials"):
        label = f"The needle grid is {ill.sentence(n, 'trials', per='cell')}. "
        if dense.empty or not dense.found.any():
            return label + f"Dense attention found the code in {int(dense.found.sum())} of {len(dense)} trials."
        key = ["length", "depth", "seed"]
        ok = dense[dense.found][key]
        counts = [f"{spec} in {int(ok.merge(g, on=key).found.sum())} of those {len(ok)}"
                  for spec, g in needle[needle.pattern != "dense"].groupby("pattern", sort=False)]
        return (label + f"Dense attention found the code in {int(dense.found.sum())} of {len(dense)} trials"
                + ("; " + "; ".join(counts) if counts else "") + ".")
    if dense.empty or not dense.found.any():
        return ("Dense attention never finds the code here, so the test cannot say what sparsity loses."
                if not dense.empty else "No needle trials were run.")
    key = ["length", "depth", "seed"]
    ok = dense[dense.found][key]
    parts = []
    for spec, g in needle[needle.pattern != "dense"].groupby("pattern", sort=False):
        m = ok.merge(g, on=key)
        far = m[m.reachable == False]  # noqa: E712  (None for Quest)
        s = f"{spec} finds it in {int(m.found.sum())} of the {len(m)} trials dense answers"
        if len(far):
            s += f" ({int(far.found.sum())} of {len(far)} where the needle lies outside its reach)"
        parts.append(s)
    return (f"Dense attention finds the code in {int(dense.found.sum())} of {len(dense)} trials. "
            + "; ".join(parts) + ". A window or sink cache cannot see a needle beyond its reach; Quest keeps "
            "every page and reads the one the question points to.")


def timing_run(model: str, patterns: Sequence[str], length: int, steps: int = 8, repeats: int = 3, seed: int = 0,
               device: str = "cpu", dtype: str = "float32", **_) -> dict:
    """Chapter 6's deciding speed-ups as one whole run (``studylib.bench.whole_runs``): in a fresh process,
    load the model and time decode steps of dense and of each pattern over a cache of ``length`` tokens
    (``decode_cost``: arms rotated per repeat, both on the per-op path), returning this run's speed-up of
    each pattern (the median dense time per token over the pattern's)."""
    from studylib.models import load_model

    lm, _ = load_model(model, device, dtype)
    dc = decode_cost(lm, [int(length)], list(patterns), repeats=repeats, steps=steps, seed=seed, progress=False)
    dense = float(dc[dc.pattern == "dense"]["ms_per_token"].median())
    return {f"speedup:{p}": dense / float(dc[dc.pattern == p]["ms_per_token"].median())
            for p in patterns if p != "dense"}
