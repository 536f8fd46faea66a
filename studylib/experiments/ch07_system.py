"""Chapter 7, part 3: throughput at saturation, and how the techniques' gains interact (claim C8).

Throughput: every request arrives at t = 0. The one baseline is plain AR decoding one request at a
time (``ar (one at a time)``); beside it the serving engine's policies (``studylib.serving``): its own
sequential loop, static batching, continuous batching, and continuous batching with the radix prefix
cache and cache-aware admission (the best extras that compose with batching in this checkout).

Interactions, each measured on this machine:
- speculative gain vs batch size: chapter 5's model E[tokens](alpha, gamma) * t(B, 1) / (t(B, gamma+1) +
  gamma * c * t(B, 1)) with measured step times t(B, n) of B sequences x n tokens and the alpha and draft
  cost ratio c of this chapter's speculative runs. Batching uses up the idle compute that verification
  was getting for free, so the gain shrinks with B;
- prefix caching vs output length: e2e(n) = TTFT + (n - 1) * TPOT per request, with and without the
  cache. A hit removes prefill only: the TTFT gain stays, the e2e gain fades as n grows;
- sparse attention vs context length: decode steps with a dense cache and with the sparse one holding
  L tokens of each of several different texts (the prompts are the units); attention is a small share
  of a step at short context.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from studylib.bench.stats import estimate, ratio_estimate, rotated
from studylib.decoding.common import Stopwatch
from studylib.errors import StudylibError
from studylib.experiments.ch05_interplay import reports_folder
from studylib.experiments.ch07_combined import BASELINE, PREFIX, agreement, paired
from studylib.verdict import RUN_CI

AR_POLICY = "ar (one at a time)"
POLICIES: dict[str, dict] = {
    AR_POLICY: {},
    "sequential": {"scheduler": "sequential"},
    "static": {"scheduler": "static"},
    "continuous": {"scheduler": "continuous"},
    "continuous + radix": {"scheduler": "continuous", "prefix_cache": "radix", "cache_aware": True},
}
BEST_POLICY = "continuous + radix"
# The forced stack (declared in decisions.yaml, C7@7 and C8@7): the serving stack with prompt lookup carried
# into the batched step, measured whatever the single-request results would have chosen.
FORCED_POLICY = "continuous + radix + prompt lookup"


def policy_name(arm: str) -> str:
    """Chapter 5's arm name in this chapter's words: ``continuous+radix+lookup:8,3`` -> ``FORCED_POLICY``."""
    from studylib.experiments.ch05_batching import parse_arm

    sched, prefix, spec = parse_arm(arm)
    return " + ".join([sched, *(["radix"] if prefix == "radix" else []), *(["prompt lookup"] if spec else [])])


# ------------------------------------------------------------------------------------------ throughput


def serving_prompts(workloads: Mapping) -> list[tuple[str, list[int]]]:
    """Round-robin over the given ``NamedWorkload``s' first-turn prompts (closed-loop follow-ups cannot
    all arrive at t = 0, so they are skipped)."""
    lists = [[(r.id, list(r.tokens)) for r in w.requests if r.follows is None] for w in workloads.values()]
    return [x for i in range(max(map(len, lists), default=0)) for lst in lists if i < len(lst) for x in [lst[i]]]


def _ar_run(model, tokenizer, prompts, max_new_tokens) -> dict:
    from studylib.decoding import ar

    clock = Stopwatch(model.device)
    outs, ttft, e2e = [], [], []
    for _, p in prompts:
        start = clock.elapsed()
        res = ar.generate(model, p, max_new_tokens, tokenizer=tokenizer)
        outs.append(res.token_ids)
        ttft.append(start + res.ttft_s)  # everything arrived at t = 0: queueing counts
        e2e.append(clock.elapsed())
    return {"duration_s": e2e[-1], "outputs": outs, "ttft": ttft, "e2e": e2e, "hit_rate": 0.0}


def _engine_run(model, tokenizer, prompts, max_new_tokens, config: dict) -> dict:
    from studylib.serving import Engine, EngineConfig, Request

    engine = Engine(model, EngineConfig(**config), tokenizer)
    reqs = [Request(f"r{i}-{rid}", p, max_new_tokens, arrival_s=0.0) for i, (rid, p) in enumerate(prompts)]
    run = engine.run(reqs)
    s = run.summary()
    if s["requests"] != len(reqs):
        bad = [f"{r.id}: {r.stop_reason} {r.error or ''}" for r in reqs if r.stop_reason in ("rejected", "abort")]
        raise RuntimeError(f"{config['scheduler']}: only {s['requests']}/{len(reqs)} requests finished ({bad}).")
    return {"duration_s": run.duration_s, "outputs": [r.output_ids for r in reqs],
            "ttft": [r.ttft_s for r in reqs], "e2e": [r.e2el_s for r in reqs], "hit_rate": s["prefix_hit_rate"]}


def throughput(model, tokenizer, prompts: Sequence[tuple[str, list[int]]], max_new_tokens: int,
               policies: Sequence[str] | None = None, repeats: int = 1, kv_budget_mib: float = 1024.0,
               max_batch_tokens: int = 1024, max_running: int = 32, block_size: int = 16,
               progress: bool | None = None, lookup: str | None = None) -> pd.DataFrame:
    """One row per (repeat, policy): output tokens per second with all requests at t = 0, and how many
    outputs equal the AR baseline's. Policies run in a rotating order per repeat. ``lookup``
    (``prompt-lookup:GAMMA,NGRAM``) adds the forced stack, ``FORCED_POLICY``, with that lookup in the batch."""
    from studylib.progress import progress_bar

    configs = dict(POLICIES)
    if lookup:
        configs[FORCED_POLICY] = {**POLICIES[BEST_POLICY], "speculate": lookup}
    policies = list(configs) if policies is None else list(policies)
    unknown = [p for p in policies if p not in configs]
    if unknown:
        raise StudylibError(f"unknown serving policies {unknown}; choose from {list(configs)} (the forced stack needs "
                            "lookup=prompt-lookup:GAMMA,NGRAM).")
    engine_opts = {"kv_budget_mib": kv_budget_mib, "max_batch_tokens": max_batch_tokens,
                   "max_running": max_running, "block_size": block_size}
    ref = None
    rows = []
    todo = [(r, p) for r in range(repeats) for p in rotated(policies, r)]
    for r, pol in progress_bar(todo, desc="ch07 throughput", leave=False, progress=progress):
        if pol == AR_POLICY:
            out = _ar_run(model, tokenizer, prompts, max_new_tokens)
        else:
            out = _engine_run(model, tokenizer, prompts, max_new_tokens, {**configs[pol], **engine_opts})
        tokens = sum(len(o) for o in out["outputs"])
        rows.append({"repeat": r, "policy": pol, "requests": len(prompts), "output_tokens": tokens,
                     "duration_s": out["duration_s"], "throughput_tok_s": tokens / out["duration_s"],
                     "ttft_p50_s": float(np.median(out["ttft"])), "e2e_p50_s": float(np.median(out["e2e"])),
                     "prefix_hit_rate": out["hit_rate"], "outputs": out["outputs"]})
        if pol == AR_POLICY and ref is None:
            ref = out["outputs"]
    df = pd.DataFrame(rows)
    if ref is not None:
        df["exact_match"] = [float(np.mean([a == b for a, b in zip(o, ref, strict=True)])) for o in df.outputs]
        df["agreement"] = [float(np.mean([agreement(a, b) for a, b in zip(o, ref, strict=True)])) for o in df.outputs]
    return df


def throughput_summary(df: pd.DataFrame, baseline: str = AR_POLICY) -> pd.DataFrame:
    """Per policy: throughput gain over the baseline (paired by repeat; seconds per output token)."""
    base = df[df.policy == baseline].set_index("repeat")
    rows = []
    for pol, g in df.groupby("policy", sort=False):
        g = g.set_index("repeat").loc[base.index]
        est = ratio_estimate((base.duration_s / base.output_tokens).to_numpy(),
                             (g.duration_s / g.output_tokens).to_numpy())
        rows.append({"policy": pol, "throughput_tok_s": float(g.throughput_tok_s.median()), "gain": est.value,
                     "gain_low": est.ci_low, "gain_high": est.ci_high, "repeats": len(g),
                     "ttft_p50_s": float(g.ttft_p50_s.median()), "e2e_p50_s": float(g.e2e_p50_s.median()),
                     "prefix_hit_rate": float(g.prefix_hit_rate.mean()),
                     "exact_match": float(g.exact_match.mean()) if "exact_match" in g else None,
                     "agreement": float(g.agreement.mean()) if "agreement" in g else None})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ speculative vs batch


def spec_gain_vs_batch(model, batches: Sequence[int], gamma: int, alpha: Mapping, cost_ratio: float,
                       context: int = 128, repeats: int = 3, out_dir: str | Path | None = None) -> tuple[pd.DataFrame, str]:
    """Chapter 5's model of the speculative gain per batch size (``ch05_interplay.c8_table``) at our
    measured alpha and its CI ends. The step-time curve is chapter 5's saved one when this profile has
    it with gamma + 1 tokens per sequence, else measured here with chapter 5's ``step_curve``."""
    from studylib.experiments.ch05_interplay import c8_table, step_curve

    rec = chapter_json(out_dir, 5) if out_dir is not None else None
    saved = pd.DataFrame(((rec or {}).get("measurements") or {}).get("step_curve") or [])
    if len(saved) and {"batch", "tokens_per_seq", "step_s"} <= set(saved) and \
            {1, gamma + 1} <= set(saved.tokens_per_seq) and set(batches) <= set(saved.batch):
        curve, source = saved[saved.batch.isin(batches)], "chapter 5's step-time curve (ch05.json)"
    else:
        curve, source = step_curve(model, batches, gamma, context, repeats), f"measured here at context {context}"
    tables = [c8_table(curve, float(a), gamma, cost_ratio) for a in (alpha["alpha"], alpha["alpha_low"],
                                                                       alpha["alpha_high"])]
    out = tables[0].rename(columns={"speculative_gain": "gain"})
    ends = np.stack([t.speculative_gain.to_numpy() for t in tables[1:]])
    out["gain_low"], out["gain_high"] = ends.min(0), ends.max(0)
    return out, source


def measured_alpha(runs: pd.DataFrame, arm: str = "speculative") -> dict | None:
    """Median per-request acceptance alpha (bootstrap CI) and draft/target cost ratio of an arm."""
    g = runs[(runs.arm == arm) & runs.alpha.notna()]
    if g.empty:
        return None
    a = estimate(g.alpha.astype(float).tolist())
    c = g.cost_ratio.dropna().astype(float)
    return {"alpha": a.value, "alpha_low": a.ci_low, "alpha_high": a.ci_high,
            "cost_ratio": float(c.median()) if len(c) else None, "requests": len(g)}


def alpha_inputs(runs: pd.DataFrame, out_dir: str | Path, gamma: int, fallback_alpha: float = 0.7,
                 fallback_cost: float = 0.1) -> dict:
    """alpha (with CI ends) and draft cost ratio: this chapter's speculative runs when they measured both,
    else chapter 2's record via chapter 5's ``speculative_inputs``, else the fallbacks (labelled)."""
    ours = measured_alpha(runs)
    if ours is not None and ours["cost_ratio"] is not None:
        return {**ours, "source": f"this chapter's speculative runs ({ours['requests']} requests)"}
    from studylib.experiments.ch05_interplay import speculative_inputs

    s = speculative_inputs(reports_folder(out_dir), fallback_alpha, gamma, fallback_cost)
    return {"alpha": s["alpha"], "alpha_low": s["alpha"], "alpha_high": s["alpha"], "cost_ratio": s["draft_cost"],
            "requests": 0, "source": s["source"]}


def chapter_json(out_dir: str | Path, chapter: int) -> dict | None:
    """Another chapter's saved record from this profile's reports, if it ran before this one."""
    f = reports_folder(out_dir) / f"ch{chapter:02d}.json"
    try:
        return json.loads(f.read_text(encoding="utf-8")) if f.exists() else None
    except (OSError, json.JSONDecodeError):
        return None


# -------------------------------------------------------------------------------- prefix vs output


def prefix_vs_output(runs: pd.DataFrame, workload: str, lengths: Sequence[int], arm: str = PREFIX,
                     baseline: str = BASELINE) -> pd.DataFrame:
    """E2e speedup of the prefix cache if every request produced n tokens, from each request's measured
    TTFT and TPOT in both arms (paired), with the measured TTFT and TPOT speedups as n -> 1 / n -> inf."""
    b, t = paired(runs, workload, arm, baseline)
    rows = []
    for n in lengths:
        e = ratio_estimate((b.ttft_s + (n - 1) * b.tpot_s).to_numpy(), (t.ttft_s + (n - 1) * t.tpot_s).to_numpy())
        rows.append({"output_tokens": int(n), "speedup": e.value, "low": e.ci_low, "high": e.ci_high})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ sparse vs context


def sparse_texts(tokenizer, prompts: int, length: int, seed: int = 0) -> list[list[int]]:
    """``prompts`` different texts of ``length`` tokens each: disjoint windows of one stream of real
    prose (``studylib.data.long_text``, NarrativeQA summaries shuffled with ``seed``)."""
    from studylib.data import long_text

    ids = long_text(tokenizer, prompts * length, seed=seed)
    return [ids[i * length:(i + 1) * length] for i in range(prompts)]


@torch.inference_mode()
def sparse_vs_context(model, spec: str, contexts: Sequence[int], steps: int = 4, seed: int = 0, prompts: int = 10,
                      tokenizer=None, progress: bool | None = None) -> pd.DataFrame:
    """See ``_sparse_vs_context``. Both arms take the per-op step: the fused C step serves the contiguous
    dense cache only, so a dense arm on it beside a sparse arm on the per-op path would measure two code
    paths, not two attention patterns."""
    import os

    old = os.environ.get("STUDYLIB_DECODE_LAYERS")
    os.environ["STUDYLIB_DECODE_LAYERS"] = "torch"
    try:
        df = _sparse_vs_context(model, spec, contexts, steps, seed, prompts, tokenizer, progress)
    finally:
        if old is None:
            os.environ.pop("STUDYLIB_DECODE_LAYERS", None)
        else:
            os.environ["STUDYLIB_DECODE_LAYERS"] = old
    df["path"] = "per-op (both arms)"
    return df


def _sparse_vs_context(model, spec: str, contexts: Sequence[int], steps: int = 4, seed: int = 0, prompts: int = 10,
                       tokenizer=None, progress: bool | None = None) -> pd.DataFrame:
    """One row per (prompt, context length L): the median decode-step time of a dense cache and of
    ``spec``'s cache holding L tokens of the prompt, and their ratio (the prompt's speed-up at L).

    The prompts are ``prompts`` different texts (``sparse_texts``; random token ids when no
    ``tokenizer`` is given): they are the independent units of every CI drawn from these rows. The
    ``steps`` decode steps within one prompt and context are not independent of one another and only
    make its value less noisy. Per prompt the two caches grow through the contexts in increasing order:
    each context's prefill extends the cache with the text's next tokens up to L (so a prompt costs one
    prefill of the longest context per cache, not one per context). Dense and sparse steps alternate, so
    drift in the machine's speed falls on both alike and cancels in the ratio."""
    from studylib.attention import make_cache
    from studylib.models import DenseKVCache
    from studylib.progress import progress_bar

    cfg, dev = model.config, model.device
    contexts = sorted({int(L) for L in contexts})
    longest = contexts[-1]
    if tokenizer is not None:
        texts = sparse_texts(tokenizer, prompts, longest, seed)
    else:
        gen = torch.Generator().manual_seed(seed)
        texts = [torch.randint(3, cfg.vocab_size, (longest,), generator=gen).tolist() for _ in range(prompts)]
    cap = longest + len(contexts) * (steps + 1) + 1
    rows = []
    for i in progress_bar(range(prompts), desc="ch07 sparse vs context", leave=False, progress=progress):
        caches = {"dense": DenseKVCache(cfg, 1, cap, dev, model.dtype), "sparse": make_cache(spec, cfg, cap, dev, model.dtype)}
        held, used = 0, 0  # tokens in each cache; tokens of the text fed so far
        for L in contexts:
            if L <= held:
                raise StudylibError(f"sparse contexts must be more than {steps + 1} tokens apart, got {contexts}.")
            ids = torch.tensor([texts[i][used:used + L - held]], device=dev)  # (1, L - held)
            tok = {}
            for k, c in caches.items():
                tok[k] = model(ids, c.begin(ids.shape[1]), logits="last").logits[:, -1].argmax(-1, keepdim=True)
            used, held = used + ids.shape[1], L
            times: dict[str, list[float]] = {"dense": [], "sparse": []}
            for s in range(steps + 1):
                for k, c in caches.items():
                    clock = Stopwatch(dev)
                    tok[k] = model(tok[k], c.begin(1), logits="last").logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
                    if s:  # step 0 warms up the decode shapes
                        times[k].append(clock.elapsed())
            held += steps + 1
            dense, sparse = float(np.median(times["dense"])), float(np.median(times["sparse"]))
            rows.append({"prompt": i, "context": L, "dense_ms": 1e3 * dense, "sparse_ms": 1e3 * sparse,
                         "speedup": dense / sparse, "steps": len(times["dense"])})
    return pd.DataFrame(rows).sort_values(["context", "prompt"], ignore_index=True)


def sparse_summary(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """Per context: the sparse pattern's decode-step speed-up over dense (ratio of the medians over
    prompts, paired bootstrap CI over prompts), with the median step times and how many prompts."""
    rows = []
    for L, g in per_prompt.groupby("context", sort=True):
        e = ratio_estimate(g.dense_ms.to_numpy(), g.sparse_ms.to_numpy())
        rows.append({"context": int(L), "dense_ms": float(g.dense_ms.median()), "sparse_ms": float(g.sparse_ms.median()),
                     "speedup": e.value, "low": e.ci_low, "high": e.ci_high, "prompts": int(len(g)),
                     "steps": int(g.steps.min())})
    return pd.DataFrame(rows, columns=["context", "dense_ms", "sparse_ms", "speedup", "low", "high", "prompts",
                                       "steps"])


def sparse_growth(per_prompt: pd.DataFrame, confidence: float = 0.95) -> dict | None:
    """Per prompt, its speed-up at the longest context divided by its speed-up at the shortest (paired
    by prompt; > 1: the gain grows with context), and the median over prompts with a bootstrap CI over
    prompts at ``confidence``. None with fewer than two contexts."""
    ctx = sorted(per_prompt.context.unique()) if len(per_prompt) else []
    if len(ctx) < 2:
        return None
    wide = per_prompt.pivot(index="prompt", columns="context", values="speedup")[[ctx[0], ctx[-1]]].dropna()
    ratio = (wide[ctx[-1]] / wide[ctx[0]]).to_numpy(dtype=float)
    e = estimate(ratio, confidence=confidence)
    at_longest = estimate(wide[ctx[-1]].to_numpy(dtype=float), confidence=confidence)
    return {"value": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high, "n": e.n, "shortest": int(ctx[0]),
            "longest": int(ctx[-1]), "gain_shortest": float(wide[ctx[0]].median()),
            "gain_longest": float(wide[ctx[-1]].median()), "gain_longest_low": at_longest.ci_low,
            "gain_longest_high": at_longest.ci_high, "confidence": confidence}


def serving_from_chapter5(out_dir: str | Path) -> dict | None:
    """C7's serving numbers as chapter 5 measured them, or None when chapter 5 has not run here.

    Chapter 5 serves 64+ requests at saturation in interleaved whole-run repeats, and measures the
    end-to-end latency a user sees at a given Poisson arrival rate; re-measuring a smaller version here
    would cost minutes and decide less. Returns {"tput": runs, "tsum": per-policy gains (this chapter's
    columns), "serving": the conditions sentence, "under_load": the latency-under-load record,
    "whole_runs": chapter 5's whole runs (``WholeRuns``, or None), where the forced stack's interaction
    with batching is measured}."""
    from studylib.bench.whole_runs import WholeRuns

    data = chapter_json(out_dir, 5)
    meas = (data or {}).get("measurements") or {}
    rec, load = meas.get("serving_for_c7"), meas.get("latency_under_load")
    if not rec or not rec.get("arms"):
        return None
    rows = []
    for a in rec["arms"]:
        ci = a.get("ci") or [None, None]
        rows.append({"policy": policy_name(a["arm"]), "throughput_tok_s": a["throughput_tok_s"],
                     "gain": a["gain"], "gain_low": ci[0], "gain_high": ci[1], "repeats": a["repeats"],
                     "method": a.get("method"), "mc_error": a.get("mc_error", 0.0), "arm": a["arm"]})
    tsum = pd.DataFrame(rows)
    runs = pd.DataFrame(meas.get("runs") or [])
    n = int(runs["requests"].max()) if "requests" in runs else None
    over_runs = tsum["method"].fillna("").str.startswith(RUN_CI).any()
    serving = (f"throughput measured in chapter 5 ({rec['conditions']}), baseline: the serving engine one request at a "
               f"time; {n} requests per saturation run, "
               + (f"{int(tsum['repeats'].max())} whole runs (fresh processes)" if over_runs else
                  f"{int(tsum['repeats'].max())} interleaved repeats in one process"))
    whole = meas.get("whole_runs")
    return {"tput": runs, "tsum": tsum, "serving": serving, "under_load": load,
            "whole_runs": WholeRuns(**whole) if whole else None}


def forced_stack_frame(tsum: pd.DataFrame) -> pd.DataFrame:
    """The selected serving stack beside the forced one (and the lookup alone, where measured): each one's
    throughput and its gain over AR one at a time, so a reader sees what adding prompt lookup did."""
    keep = [p for p in (BEST_POLICY, FORCED_POLICY, "sequential + prompt lookup") if p in set(tsum.policy)]
    role = {BEST_POLICY: "selected serving stack", FORCED_POLICY: "forced stack (declared before the run)",
            "sequential + prompt lookup": "the lookup alone, one request at a time"}
    rows = tsum.set_index("policy").loc[keep].reset_index()
    return pd.DataFrame({"stack": rows.policy, "role": rows.policy.map(role), "tokens per second": rows.throughput_tok_s,
                         "gain over AR one at a time": rows.gain, "low": rows.gain_low, "high": rows.gain_high,
                         "n": rows.repeats})
