"""Chapter 8: computation compression. The same model in fewer bytes, and what that buys per token.

The embedded model (SmolLM2-135M) is distributed in 4-bit: its GGUF file stores the linears as Q4_1
blocks and the embedding (tied to the head) as Q8_0, and the study's dense fp32 model is those blocks
widened. So the loss of the 4-bit distribution against a bf16 original cannot be measured with this
model; what the chapter measures is the speed of keeping the native format (``gguf``, and ``q4_1``,
which re-quantises to the very same blocks: identical to the reference by construction, shown and never
counted) and the speed and loss of compressing further or changing the arithmetic (the arms that decide
C9, declared in ``notebooks/params/decisions.yaml`` as C9@8).

Arms (``--weights`` formats, ``models.weights``): ``dense`` (fp32, the reference), ``bf16`` (dense in
bfloat16), ``gguf`` (the file's own blocks), the re-quantisations ``q8_0``, ``q4_1``, ``q4_0``, ``awq4``
(Q4_0 with activation-aware scales), ``gguf+bf16prefill`` (bf16 GEMMs for long steps) and ``kv_int8``
(fp32 weights, an 8-bit KV cache) and ``gguf@int8`` (the file's blocks with activations rounded to int8 per
block and integer dot products, ``--act int8``: llama.cpp's scheme, so its greedy agreement with
llama.cpp is shown beside ``gguf``'s) and ``gguf@bf16`` (the same blocks with activations rounded to bf16, bf16
dot products, ``--act bf16``). Speeds are ratios to an fp32 reference on the *same engine path*,
measured in the same run, prompt by prompt, with the arms in rotating order: the weight formats and the
reference ``dense`` run every layer of a decode step in one C call (``models.decode_layers``; the
reference with plain fp32 weights through the same kernel), while ``bf16`` and ``kv_int8``, which that
path does not take, are compared with ``dense_perop``, the same fp32 model on the per-op PyTorch path. So
a speed-up is the format's, not a different engine's.

Quality is measured against the dense fp32 arm in one teacher-forced pass per arm and document
(``quality_runs``): per-token KL divergence, top-1 agreement and perplexity ratio (shown, not decisive),
and the task that decides, next-word prediction over every word of the document
(``studylib.eval.lastword``): the ratio of words right, arm over reference, with a bootstrap CI over
documents at the Bonferroni-corrected confidence, and MLPerf's ">= 99% of the reference" rule, judged
only where that CI can see a 1% change.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from studylib import plots
from studylib.bench.stats import estimate, no_ci, ratio_estimate, reaches_level, rotated
from studylib.claims import (
    FAILS,
    Verdict,
    corrected_confidence,
    decide_conditions,
    decide_parts,
    judge_at_least,
    judge_checks,
)
from studylib.decoding import ar
from studylib.eval import lastword
from studylib.models import DenseKVCache, load_model
from studylib.progress import progress_bar
from studylib.workbook.tables import why_not_measured

CHAPTER = 8
BASELINE = "dense"
PER_OP_BASELINE = "dense_perop"  # the reference on the per-op path, for arms the fused path does not take
PER_OP_ARMS = ("bf16", "kv_int8")
SPEED_ONLY = (PER_OP_BASELINE,)  # a timing reference only: the same model as BASELINE
ARM_LOAD = {"dense": ("float32", "dense"), "bf16": ("bfloat16", "dense"),  # others: (float32, arm)
            "kv_int8": ("float32", "dense"), PER_OP_BASELINE: ("float32", "dense")}


def baseline_of(arm: str, arms) -> str:
    """The reference a speed of ``arm`` is a ratio to (see the module docstring)."""
    return PER_OP_BASELINE if arm in PER_OP_ARMS and PER_OP_BASELINE in arms else BASELINE
ATTENTION = {"kv_int8": "int8kv"}  # arms that differ from the reference in the KV cache, not the weights
# Arms that change the activations' arithmetic, not the weights: ARM@ACT loads --weights ARM --act ACT.
ARM_ACT = {"gguf@int8": ("gguf", "int8"), "gguf@bf16": ("gguf", "bf16")}


def _cache(arm: str, model, max_len: int):
    from studylib.attention import make_cache

    return make_cache(ATTENTION.get(arm, "dense"), model.config, max_len, model.device, model.dtype)


def documents(tok, n: int, tokens: int, seed: int = 0) -> list[list[int]]:
    """The first ``tokens`` token ids of ``n`` XSum articles at least that long (seeded sample): the
    prompts of the prefill timing (timing only: nothing is scored on them)."""
    import random

    from studylib.data import load_dataset

    records = load_dataset("xsum")
    random.Random(seed).shuffle(records)
    out = []
    for rec in records:
        ids = [int(i) for i in tok(rec.meta["document"])["input_ids"]]
        if len(ids) >= tokens:
            out.append(ids[:tokens])
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} XSum articles have {tokens} tokens; ask for fewer or shorter")


def task_documents(tok, n: int, tokens: int, seed: int = 0) -> list[list[int]]:
    """``n`` held-out documents of ``tokens`` token ids (``lastword.documents``, XSum articles): the
    documents of the quality pass and of the next-word task, one teacher-forced forward per arm and
    document serving both. They need not be disjoint from each other's, since they are one set and only
    the task decides (KL, top-1 and perplexity are shown beside it). They are disjoint from what could
    bias the task: AWQ's calibration text (NarrativeQA, ``calibration_ids``) and the chat prompts of the
    speed runs (another dataset); the prefill timing's articles may overlap them, which is harmless
    because nothing is scored there."""
    return lastword.documents(tok, n, tokens, seed=seed)


def competing(path=None) -> int:
    """k: how many configurations (lossy arms) compete for C9 in this chapter, as declared before the run
    (``decisions.yaml``, C9@8); each CI that decides is taken at ``corrected_confidence(k)``."""
    from studylib import decisions

    return decisions.level("C9", CHAPTER, path)[1]


def calibration_ids(tok, tokens: int, seed: int = 0, rows: int = 4) -> torch.Tensor:
    """AWQ's calibration batch: ``rows`` x ``tokens // rows`` ids of NarrativeQA prose."""
    from studylib.data import long_text

    ids = long_text(tok, tokens, seed=seed, source="narrativeqa")
    per = tokens // rows
    return torch.tensor(ids[: per * rows]).view(rows, per)


def load_arms(model_name: str, arms: Sequence[str], device: str = "cpu", calibration_tokens: int = 512,
              seed: int = 0, progress: bool = True) -> tuple[dict, object]:
    """Every arm's model (the first arm is the reference) and the tokenizer. ``awq4`` calibrates on
    ``calibration_tokens`` of NarrativeQA prose (``calibration_ids``)."""
    from studylib.models.weights import apply_weights

    if not arms or arms[0] != BASELINE:
        raise ValueError(f"arms must start with the reference {BASELINE!r}, got {list(arms)}")
    arms = list(arms)
    if any(a in PER_OP_ARMS for a in arms) and PER_OP_BASELINE not in arms:
        arms.insert(1, PER_OP_BASELINE)
    models, tok = {}, None
    for arm in progress_bar(arms, desc="loading formats", progress=progress):
        dtype, weights = ARM_LOAD.get(arm, ("float32", arm))
        if arm in ARM_ACT:
            weights, act = ARM_ACT[arm]
            models[arm], tok = load_model(model_name, device, dtype, weights=weights, act=act)
        elif weights == "awq4":  # calibrated on real text, not the quantiser's fallback
            m, tok = load_model(model_name, device, dtype)
            models[arm] = apply_weights(m, "awq4", calibration=calibration_ids(tok, calibration_tokens, seed))
        else:
            models[arm], tok = load_model(model_name, device, dtype, weights=weights)
    models[BASELINE].fused_decode = True  # the reference on the weight formats' engine path
    return models, tok


AWQ_NOT_COMPARABLE = ("AWQ scales each input channel (the inverse scales sit in the norms), so its weights "
                      "cannot be compared with the dense ones one by one")


def footprint(models: Mapping[str, object]) -> pd.DataFrame:
    """Weight bytes one decode step reads, per arm, and bits per weight averaged over those bytes (every matrix
    a step reads, so a format that keeps the head at 8 bits averages above its blocks' own bits)."""
    from studylib.models.weights import weight_bytes

    rows = []
    base = weight_bytes(models[BASELINE])
    for arm, m in models.items():
        b = weight_bytes(m)
        rows.append({"arm": arm, "weight_mib": b / 2**20, "bits_per_weight": 32 * b / base, "bytes_vs_dense": b / base,
                     "kv_kib_per_token": kv_bytes_per_token(arm, m) / 1024,
                     "weight_rel_error": weight_error(models[BASELINE], m) if arm not in ATTENTION else 0.0})
    return why_not_measured(pd.DataFrame(rows), weight_rel_error=AWQ_NOT_COMPARABLE)


def kv_bytes_per_token(arm: str, model) -> int:
    """Bytes of KV cache one token keeps (and every later step reads), from the cache the arm allocates."""
    return _cache(arm, model, 1).nbytes


@torch.inference_mode()
def weight_error(ref, model) -> float | None:
    """||W - W_ref|| / ||W_ref|| over every linear (as the arm computes with them, widened to fp32);
    0.0 means the arm holds exactly the reference's weights. None for ``awq4``, whose weights are
    scaled per channel (the inverse scales sit in the norms), so they are not comparable one by one."""
    from studylib.models.quant import QuantTensor
    from studylib.models.weights import linear_weights

    if model.weights_format.startswith("awq4"):
        return None
    num = den = 0.0
    for w, r in zip(linear_weights(model), linear_weights(ref), strict=True):
        w = w.dequantize() if isinstance(w, QuantTensor) else w.float()
        num += float((w - r.float()).pow(2).sum())
        den += float(r.float().pow(2).sum())
    return math.sqrt(num / den)


def decode_runs(models: Mapping[str, object], prompts: Sequence[Sequence[int]], new_tokens: int,
                progress: bool = True) -> pd.DataFrame:
    """Each prompt decoded greedily by every arm, arms in rotating order per prompt."""
    arms = list(models)
    rows = []
    jobs = list(enumerate(prompts))
    for i, ids in progress_bar(jobs, desc="decode speed", progress=progress):
        for arm in rotated(arms, i):
            r = ar.generate(models[arm], list(ids), new_tokens, attention=ATTENTION.get(arm))
            rows.append({"arm": arm, "prompt": i, "prompt_tokens": len(ids), "new_tokens": r.new_tokens,
                         "ttft_s": r.ttft_s, "wall_s": r.wall_s,
                         "decode_s_per_token": (r.wall_s - r.ttft_s) / max(r.new_tokens - 1, 1),
                         "tokens": list(r.token_ids)})
    return pd.DataFrame(rows)


def prefill_runs(models: Mapping[str, object], docs: Sequence[Sequence[int]], progress: bool = True) -> pd.DataFrame:
    """Seconds to prefill each document (logits of the last position only), arms rotated per document."""
    arms = list(models)
    rows = []
    for i, ids in progress_bar(list(enumerate(docs)), desc="prefill speed", progress=progress):
        x = torch.tensor([list(ids)])
        for arm in rotated(arms, i):
            m = models[arm]
            cache = _cache(arm, m, x.shape[1])
            t0 = time.perf_counter()
            m(x, cache.begin(x.shape[1]), logits="last")
            rows.append({"arm": arm, "doc": i, "tokens": x.shape[1], "seconds": time.perf_counter() - t0})
    return pd.DataFrame(rows)


def speed_summary(decode: pd.DataFrame, prefill: pd.DataFrame, roofline_tok_s: Mapping[str, float],
                  confidence: float = 0.95) -> pd.DataFrame:
    """Per arm: decode tok/s and its speed-up over its fp32 reference on the same engine path (paired per
    prompt), prefill speed-up (paired per document), and the share of the bandwidth roofline reached.
    Every CI is at ``confidence`` (``corrected_confidence(competing())`` in the chapter)."""
    rows = []
    arms = list(decode.arm.unique())
    for arm in arms:
        ref = baseline_of(arm, arms)
        base_d = decode[decode.arm == ref].sort_values("prompt")
        base_p = prefill[prefill.arm == ref].sort_values("doc")
        d = decode[decode.arm == arm].sort_values("prompt")
        p = prefill[prefill.arm == arm].sort_values("doc")
        tps = estimate(1 / d.decode_s_per_token.to_numpy(), confidence=confidence)
        sp = ratio_estimate(base_d.decode_s_per_token.tolist(), d.decode_s_per_token.tolist(), confidence=confidence)
        pf = ratio_estimate(base_p.seconds.tolist(), p.seconds.tolist(), confidence=confidence)
        roof = roofline_tok_s.get(arm, float("nan"))
        # a CI that cannot reach its level (the [min, max] of 2 prompts covers 50%) is not shown as one: the
        # value stands alone; the decision reads the whole runs, not this table
        (tl, th), (sl, sh), (pl, ph) = ((e.ci_low, e.ci_high) if reaches_level(e) else (float("nan"),) * 2
                                        for e in (tps, sp, pf))
        rows.append({"arm": arm, "baseline": ref, "decode_tok_s": tps.value, "decode_tok_s_low": tl,
                     "decode_tok_s_high": th, "speedup": sp.value, "speedup_low": sl,
                     "speedup_high": sh, "prefill_speedup": pf.value, "prefill_low": pl,
                     "prefill_high": ph, "roofline_tok_s": roof,
                     "fraction_of_roofline": tps.value / roof if roof else float("nan"), "n": sp.n,
                     "confidence": confidence, "estimate": sp})
    return pd.DataFrame(rows)


def roofline(models: Mapping[str, object], context: int, bandwidth_gbs: float) -> dict[str, float]:
    """Bandwidth-bound decode tok/s per arm at ``context`` tokens: weight bytes + the KV cache read."""
    from studylib.models.weights import weight_bytes

    out = {}
    for arm, m in models.items():
        step = weight_bytes(m) + (context + 1) * kv_bytes_per_token(arm, m)
        out[arm] = bandwidth_gbs * 1e9 / step
    return out


@torch.inference_mode()
def quality_runs(models: Mapping[str, object], docs: Sequence[Sequence[int]], tokenizer=None,
                 progress: bool = True) -> dict:
    """One teacher-forced pass of every document under every arm (the reference first, then the arms in
    rotating order per document) against the dense fp32 reference: per document mean KL(dense || arm),
    top-1 agreement and mean NLL; all per-token KLs per arm (for the tail percentile). With
    ``tokenizer``, the same pass's argmax also scores the next-word task (``lastword.score_logits`` on
    ``lastword.word_spans`` of each document): ``words[arm][d]`` is the boolean array of words the arm
    got right in document d, paired item by item with the reference's, and ``chance`` a uniform
    guesser's accuracy on those words."""
    models = {a: m for a, m in models.items() if a not in SPEED_ONLY}
    others = [a for a in models if a != BASELINE]
    rows, kls = [], {arm: [] for arm in models}
    words: dict[str, list[np.ndarray]] = {arm: [] for arm in models}
    all_spans = []
    for i, ids in progress_bar(list(enumerate(docs)), desc="quality", progress=progress):
        x = torch.tensor([list(ids)])
        y = x[0, 1:]
        spans = lastword.word_spans(tokenizer, list(ids)) if tokenizer is not None else None
        if spans is not None:
            all_spans += spans
        ref = None
        for arm in [BASELINE, *rotated(others, i)]:
            m = models[arm]
            logits = m(x, _cache(arm, m, x.shape[1]).begin(x.shape[1])).logits[0, :-1]
            logp = F.log_softmax(logits.float(), -1)
            nll = float(-logp.gather(1, y[:, None]).mean())
            if ref is None:
                ref = logp
            kl = (ref.exp() * (ref - logp)).sum(-1).clamp_min(0)
            kls[arm].append(kl.numpy())
            top = logp.argmax(-1)
            if spans is not None:
                words[arm].append(lastword.score_logits(top, list(ids), spans))
            rows.append({"arm": arm, "doc": i, "tokens": int(y.numel()), "nll": nll, "kl": float(kl.mean()),
                         "top1": float((ref.argmax(-1) == top).float().mean()),
                         "words": len(spans) if spans is not None else 0,
                         "words_right": int(words[arm][-1].sum()) if spans is not None else 0})
    vocab = next(iter(models.values())).config.vocab_size
    out = {"docs": pd.DataFrame(rows), "kl_tokens": {a: np.concatenate(v) for a, v in kls.items()}}
    if tokenizer is not None:
        out["words"] = words
        out["chance"] = lastword.chance_score(all_spans, vocab)
    return out


def _paired_ratio_ci(base: np.ndarray, arm: np.ndarray, fn, seed: int = 0) -> tuple[float, float, float]:
    """fn(arm sample) / fn(base sample) with a bootstrap over the paired units."""
    point = fn(arm) / fn(base)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, base.size, size=(2000, base.size))
    boots = np.array([fn(arm[j]) / fn(base[j]) for j in idx])
    lo, hi = np.nanpercentile(boots, [2.5, 97.5])
    return float(point), float(lo), float(hi)


def quality_summary(q: dict) -> pd.DataFrame:
    """Per arm: perplexity ratio to dense (CI over documents), mean and 99.9th-percentile KL, top-1."""
    docs = q["docs"]
    base = docs[docs.arm == BASELINE].sort_values("doc")
    rows = []
    for arm in docs.arm.unique():
        d = docs[docs.arm == arm].sort_values("doc")
        r, lo, hi = _paired_ratio_ci(base.nll.to_numpy(), d.nll.to_numpy(), lambda a: math.exp(a.mean()))
        top1 = estimate(d.top1.to_numpy(), statistic=np.mean)
        kl_tok = q["kl_tokens"][arm]
        rows.append({"arm": arm, "ppl": math.exp(float(np.average(d.nll, weights=d.tokens))), "ppl_ratio": r, "ppl_ratio_low": lo,
                     "ppl_ratio_high": hi, "kl_mean": float(kl_tok.mean()),
                     "kl_p999": float(np.percentile(kl_tok, 99.9)), "top1": top1.value, "top1_low": top1.ci_low,
                     "top1_high": top1.ci_high, "n": len(d)})
    return pd.DataFrame(rows)


def word_task_summary(q: dict, confidence: float = 0.95, bar_change: float = 0.01) -> pd.DataFrame:
    """Per arm: the next-word task (``quality_runs(..., tokenizer=...)``) against the reference: share of
    words right, the ratio of words right (``lastword.paired_ratio``: bootstrap CI over documents at
    ``confidence``), and its power to see ``bar_change`` (mdc, has_power, n_needed). ``estimate`` (for
    ``judge_at_least``, unit documents) and ``power`` (``lastword.power_fields``) go to the verdict."""
    words = q["words"]
    ref = words[BASELINE]
    rows = []
    for arm, items in words.items():
        tr = lastword.paired_ratio(ref, items, confidence=confidence, bar_change=bar_change,
                                   chance=q.get("chance", float("nan")))
        rows.append({"arm": arm, "word_acc": tr.arm_score, "reference_acc": tr.reference_score,
                     "task_ratio": tr.value, "task_ratio_low": tr.ci_low, "task_ratio_high": tr.ci_high,
                     "mdc": tr.mdc, "has_power": tr.has_power, "n_needed": tr.n_needed, "words": tr.items,
                     "discordant": tr.discordant, "chance": tr.chance, "n": tr.n, "confidence": confidence,
                     "estimate": lastword.as_estimate(tr), "power": lastword.power_fields(tr)})
    return pd.DataFrame(rows)


def identity_runs(models: Mapping[str, object], prompts: Sequence[Sequence[int]], new_tokens: int,
                  arm: str = "gguf", progress: bool = True) -> pd.DataFrame:
    """Greedy tokens of the reference and ``arm`` on every prompt (the exactness check of a lossless
    format, on more prompts than the speed runs need); rows shaped like ``decode_runs``'."""
    rows = []
    for i, ids in progress_bar(list(enumerate(prompts)), desc=f"{arm} = dense?", progress=progress):
        for a in rotated([BASELINE, arm], i):
            rows.append({"arm": a, "prompt": i, "tokens": list(ar.generate(models[a], list(ids), new_tokens).token_ids)})
    return pd.DataFrame(rows)


@torch.inference_mode()
def fusion_runs(model, prefix: int, repeats: int, progress: bool = True) -> pd.DataFrame:
    """One-token decode steps of a block-format ``model`` with every layer in one C call
    (``decode_layers``) and with the per-op PyTorch layers, interleaved: what the framework's per-op
    overhead costs per token, and what fusing it away saves."""
    import os

    ids = torch.arange(10, 10 + prefix)[None]
    cache = DenseKVCache(model.config, 1, prefix + 1)
    model(ids, cache.begin(prefix), logits="none")
    rows = []
    before = os.environ.get("STUDYLIB_DECODE_LAYERS")
    try:
        for r in progress_bar(range(repeats), desc="fused vs per-op", progress=progress):
            for path in rotated(["auto", "torch"], r):
                os.environ["STUDYLIB_DECODE_LAYERS"] = path
                for _ in range(2):  # the first step after a switch is a warm-up
                    t0 = time.perf_counter()
                    model(torch.tensor([[42]]), cache.begin(1))
                    dt = time.perf_counter() - t0
                    cache.truncate(prefix)
                rows.append({"path": "one C call per step" if path == "auto" else "per-op PyTorch", "repeat": r,
                             "ms": 1e3 * dt})
    finally:
        if before is None:
            os.environ.pop("STUDYLIB_DECODE_LAYERS", None)
        else:
            os.environ["STUDYLIB_DECODE_LAYERS"] = before
    return pd.DataFrame(rows)


def fusion_summary(runs: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    rows = []
    for path, g in runs.groupby("path", sort=False):
        e = estimate(g.ms.to_numpy())
        rows.append({"path": path, "ms_per_token": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high, "n": e.n})
    t = pd.DataFrame(rows)
    fused = runs[runs.path == "one C call per step"].sort_values("repeat").ms.tolist()
    perop = runs[runs.path == "per-op PyTorch"].sort_values("repeat").ms.tolist()
    sp = ratio_estimate(perop, fused)
    text = (f"One decode step of the block-format model costs {t.ms_per_token.iloc[0]:.1f} ms through "
            f"`{t.path.iloc[0]}` and {t.ms_per_token.iloc[1]:.1f} ms through `{t.path.iloc[1]}` "
            f"(median of {sp.n} interleaved repeats; fused / per-op speed-up {sp.value:.2f}x, CI "
            f"{sp.ci_low:.2f}-{sp.ci_high:.2f}). The linears are the same kernel in both; the difference is the "
            "~50 small PyTorch operations per layer (norms, RoPE, KV writes, attention, SiLU, residuals) and their "
            "dispatch, which cost as much as reading the 4-bit weights.")
    return t, text


def greedy_identity(decode: pd.DataFrame, arm: str = "gguf") -> dict:
    """Prompt by prompt: does ``arm`` emit exactly dense fp32's greedy tokens? Flips are listed with the
    first position at which they part."""
    base = decode[decode.arm == BASELINE].set_index("prompt").tokens
    other = decode[decode.arm == arm].set_index("prompt").tokens
    flips = []
    for p, toks in other.items():
        ref = base[p]
        if list(toks) != list(ref):
            at = next((i for i, (a, b) in enumerate(zip(toks, ref, strict=False)) if a != b), min(len(toks), len(ref)))
            flips.append({"prompt": int(p), "first_difference": at})
    return {"arm": arm, "prompts": int(other.size), "identical": int(other.size - len(flips)), "flips": flips}


@torch.inference_mode()
def step_cost(models: Mapping[str, object], rows: Sequence[int], prefix: int, repeats: int,
              progress: bool = True) -> pd.DataFrame:
    """Seconds of one forward of ``n`` new rows after a ``prefix``-token context (a verify block of n
    tokens, causal), per arm and n, ``repeats`` times with the arms and sizes interleaved."""
    out = []
    ids = torch.arange(10, 10 + prefix)[None]
    caches = {}
    for arm, m in models.items():
        cache = _cache(arm, m, prefix + max(rows))
        m(ids, cache.begin(prefix), logits="none")
        caches[arm] = cache
    jobs = [(r, n) for r in range(repeats) for n in rows]
    for k, (r, n) in enumerate(progress_bar(jobs, desc="step cost", progress=progress)):
        for arm in rotated(list(models), k):
            m, cache = models[arm], caches[arm]
            x = torch.arange(20, 20 + n)[None]
            t0 = time.perf_counter()
            m(x, cache.begin(n), logits="all")
            out.append({"arm": arm, "rows": n, "repeat": r, "seconds": time.perf_counter() - t0})
            cache.truncate(prefix)
    return pd.DataFrame(out)


def step_cost_summary(cost: pd.DataFrame) -> pd.DataFrame:
    """Per arm and rows: median seconds (CI over repeats), tokens/s of the step, and v(n) = t(n)/t(1),
    the verify cost speculative decoding pays for n tokens relative to one decode step."""
    rows = []
    for arm, g in cost.groupby("arm", sort=False):
        t1 = g[g.rows == g.rows.min()].seconds.median()
        for n, h in g.groupby("rows"):
            e = estimate(h.seconds.to_numpy())
            rows.append({"arm": arm, "rows": int(n), "ms": 1e3 * e.value, "ms_low": 1e3 * e.ci_low,
                         "ms_high": 1e3 * e.ci_high, "tok_s": n / e.value, "verify_cost": e.value / t1,
                         "n": e.n})
    return pd.DataFrame(rows)


def combined(speed: pd.DataFrame, quality: pd.DataFrame, task: pd.DataFrame, fp: pd.DataFrame) -> pd.DataFrame:
    """One row per arm: what it reads, how fast it decodes, what it keeps (the next-word ratio decides;
    perplexity ratio, KL and top-1 agreement are shown beside it)."""
    cols_s = ["arm", "baseline", "decode_tok_s", "speedup", "speedup_low", "speedup_high", "prefill_speedup",
              "fraction_of_roofline", "confidence"]
    cols_q = ["arm", "ppl_ratio", "ppl_ratio_low", "ppl_ratio_high", "kl_mean", "kl_p999", "top1"]
    cols_t = ["arm", "word_acc", "task_ratio", "task_ratio_low", "task_ratio_high", "mdc", "n_needed"]
    out = fp.merge(speed[cols_s], on="arm").merge(quality[cols_q], on="arm").merge(task[cols_t], on="arm")
    return why_not_measured(out, weight_rel_error=AWQ_NOT_COMPARABLE)


def plot_frontier(table: pd.DataFrame, ax=None):
    """Quality vs speed: decode speed-up over dense fp32 (x) against mean KL to dense (y, log)."""
    import matplotlib.pyplot as plt

    from studylib import plots

    ax = ax or plt.subplots(figsize=(7.5, 4.5))[1]
    points = []
    for r in table.itertuples():
        if r.arm in SPEED_ONLY:
            continue
        kl = max(r.kl_mean, 1e-7)
        ci = np.isfinite([r.speedup_low, r.speedup_high]).all()  # no bar where the table shows no CI
        ax.errorbar(r.speedup, kl, xerr=[[r.speedup - r.speedup_low], [r.speedup_high - r.speedup]] if ci else None,
                    fmt="o",
                    color=plots.color("studylib" if r.arm != BASELINE else "ar"), capsize=3)
        points.append((r.arm, r.speedup, kl))
    ax.set(yscale="log", xlabel="decode speed-up over dense fp32 on the same path (median, 95% CI)",
           ylabel="mean KL(dense || format), nats/token (floor 1e-7)",
           title="The quality/speed frontier of weight formats")
    plots.label_points(ax, points)
    return plots.tidy(ax)


def plot_step_cost(summary: pd.DataFrame, ax=None):
    """Tokens/s of one step vs rows in it: where a format turns compute-bound."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    sns.lineplot(summary, x="rows", y="tok_s", hue="arm", marker="o", ax=ax)
    ax.set(xscale="log", yscale="log", xlabel="rows in the step (batch or verify block)",
           ylabel="tokens/s of the step", title="Where each format stops being bandwidth-bound")
    ax.set_xticks(sorted(summary.rows.unique()), labels=[str(n) for n in sorted(summary.rows.unique())])
    return plots.tidy(ax)


def exact_arms(fp: pd.DataFrame) -> list[str]:
    """Arms that hold exactly the reference's weights (relative weight error 0), its KV cache and its
    arithmetic (no ``+option`` such as bf16 prefill): the same model, whose quality part is identical
    greedy output rather than a task score."""
    return [r.arm for r in fp.itertuples() if r.arm not in (BASELINE, *SPEED_ONLY, *ATTENTION, *ARM_ACT)
            and "+" not in r.arm and r.weight_rel_error == 0.0]


def identities_for(fp: pd.DataFrame, decode: pd.DataFrame, checked: Mapping[str, dict | None]) -> dict:
    """Greedy identity per exact arm: the dedicated check where one ran (``checked``), else the decode runs'."""
    return {a: checked.get(a) or greedy_identity(decode, a) for a in exact_arms(fp)}


def step_arms(models: Mapping[str, object]) -> dict:
    """The reference and the first block-format arm, for the step-cost curve (both on the fused path)."""
    block = next((a for a, m in models.items() if m.weights_format != "dense"), None)
    return {a: models[a] for a in (BASELINE, block) if a is not None}


def judge_c9(speed: pd.DataFrame, task: pd.DataFrame, identities: Mapping[str, dict], conditions: str,
             speed_bar: float = 2.0, quality_bar: float = 0.99, tried: int | None = None, runs=None) -> list[Verdict]:
    """C9, one decision over the formats, each a condition: a format breaks the per-token limit
    "substantially" when its decode speed-up over the fp32 model on the same engine path clears
    ``speed_bar`` (CI over prompts) AND it keeps >99% of quality by MLPerf's rule (next-word accuracy
    ratio >= ``quality_bar``, CI over documents, judged with its power: a CI that cannot see a 1% change
    reads "inconclusive: no power").

    ``tried`` is the number of configurations that compete (default: as declared, ``competing()``);
    every CI that decides is read at ``corrected_confidence(tried)`` (``speed`` and ``task`` must have
    been computed at it). Arms in ``identities`` hold the reference's own weights and arithmetic
    (``exact_arms``: ``gguf``, and ``q4_1`` on the embedded model): their quality part is identical
    greedy output, and their composite row is true by construction, shown and never counted. The
    other arms decide.

    Returns [decision, then per arm its composite row followed by its speed and quality rows]."""
    tried = competing() if tried is None else int(tried)
    confidence = corrected_confidence(tried)
    for name, frame in (("speed", speed), ("task", task)):
        if "confidence" in frame and not np.allclose(frame.confidence.astype(float), confidence):
            raise ValueError(f"{name} was computed at {float(frame.confidence.iloc[0]):.4g} confidence, but "
                             f"{tried} configurations compete: compute it at corrected_confidence({tried}) = "
                             f"{confidence:.4g}")
    decisions, names = [], []
    t = task.set_index("arm")
    for r in speed.itertuples():
        if r.arm in (BASELINE, *SPEED_ONLY):
            continue
        ref = "dense fp32, same engine path" if r.baseline == BASELINE else "dense fp32, per-op path"
        # machine-level: judged over whole runs (t on the log of the run medians, at the corrected level);
        # this page's prompt-level CI is shown beside it; without runs the row counts no repeats
        key = f"speedup:{r.arm}"
        over = runs is not None and key in runs.metrics()
        beside = (f"{len(runs.runs)} whole runs (fresh processes); in this page's main run, over {r.n} prompts: "
                  f"{_value_ci(r.speedup, r.speedup_low, r.speedup_high, '.3g')} (shown, not deciding)") if over else ""
        sp = judge_at_least("C9", f"decode speed-up over {ref}, {r.arm}",
                            runs.estimate(key, confidence) if over else r.estimate, speed_bar,
                            f">= {speed_bar:g}x faster per token", "; ".join(x for x in (conditions, beside) if x),
                            CHAPTER, unit="whole runs", confidence=confidence, tried=tried)
        speed_parts = [sp]
        gkey = f"speedup_vs_gguf:{r.arm}"
        if r.arm in ARITHMETIC_ARMS and runs is not None:
            vs_gguf = runs.get(gkey, confidence) or no_ci(confidence=confidence)
            # the arithmetic's own gain, the 4-bit weights held fixed: gguf's gain over fp32 is not its own
            speed_parts.append(judge_at_least(
                "C9", f"decode speed-up over gguf (weights fixed), {r.arm}", vs_gguf,
                speed_bar, f">= {speed_bar:g}x faster per token than the same weights in fp32 arithmetic",
                "; ".join(x for x in (conditions, f"{len(runs.runs)} whole runs (fresh processes)") if x), CHAPTER,
                unit="whole runs", confidence=confidence, tried=tried))
        ident = identities.get(r.arm)
        exact = ident is not None
        if exact:
            q = judge_checks("C9", f"greedy output identical to dense fp32, {r.arm}",
                             {f"prompt {i}": i not in {f['prompt'] for f in ident['flips']}
                              for i in range(ident["prompts"])}, "lossless", conditions, CHAPTER,
                             measured=ident["identical"] / ident["prompts"], n=ident["prompts"], unit="prompts",
                             by_construction=True)
        else:
            tr = t.loc[r.arm]
            q = judge_at_least("C9", f"next-word accuracy ratio vs dense fp32, {r.arm}", tr["estimate"], quality_bar,
                               f">= {quality_bar:.0%} of the reference's next-word accuracy (MLPerf)", conditions,
                               CHAPTER, unit="documents", confidence=confidence, tried=tried, power=tr["power"])
        parts = decide_parts("C9", f"{r.arm}: >= {speed_bar:g}x AND >{quality_bar:.0%} quality", [*speed_parts, q],
                             "", conditions, CHAPTER)
        if exact:
            parts[0] = dataclasses.replace(
                parts[0], by_construction=True,
                conditions="; ".join(c for c in (parts[0].conditions, "shown, not counted: the reference's own "
                                                 "weights and arithmetic, so no loss to measure") if c))
        decisions.append(parts)
        names.append(r.arm)
    rows = decide_conditions("C9", f"a format that changes the weights or the arithmetic, >= {speed_bar:g}x faster "
                             f"per token with >{quality_bar:.0%} quality", [d[0] for d in decisions],
                             "compression substantially breaks the per-token limit", conditions, CHAPTER, names=names)
    return [rows[0], *[row for d, comp in zip(decisions, rows[1:], strict=True) for row in (comp, *d[1:])]]


# Arms that keep the GGUF's own weights and change only the arithmetic: their gain is judged against gguf
# too (weights fixed), so a speed-up that is gguf's own 4-bit gain is not credited to the arithmetic.
ARITHMETIC_ARMS = ("gguf@int8", "gguf@bf16", "gguf+bf16prefill")


def timing_run(model: str, arms: Sequence[str], prompts: int, new_tokens: int, seed: int = 0, device: str = "cpu",
               calibration_tokens: int = 512, **_) -> dict:
    """Chapter 8's deciding speed-ups as one whole run (``studylib.bench.whole_runs``): in a fresh process,
    load every arm, decode ``prompts`` chat prompts greedily with each (arms rotated per prompt) and return
    per arm its speed-up over its fp32 reference (``baseline_of``) and, for the arithmetic arms, over gguf:
    the median time per decoded token of the baseline over the arm's."""
    from studylib.data import load_workload
    from studylib.prompts import encode

    models, tok = load_arms(model, list(arms), device, calibration_tokens=calibration_tokens, seed=seed,
                            progress=False)
    ids = [encode(tok, r) for r in load_workload("chat", n=prompts, seed=seed)]
    dec = decode_runs(models, ids, new_tokens, progress=False)
    per = dec.groupby("arm")["decode_s_per_token"].median()
    names = list(models)
    out = {}
    for arm in names:
        out[f"speedup:{arm}"] = float(per[baseline_of(arm, names)] / per[arm])
        if arm in ARITHMETIC_ARMS and "gguf" in per:
            out[f"speedup_vs_gguf:{arm}"] = float(per["gguf"] / per[arm])
    return out


def formats_text(flags=None) -> str:
    """The formats, in words; what multiplies bf16 here is said from ``flags`` (this CPU's by default,
    as provenance records them), not typed in: the notebook runs on machines with and without AMX."""
    from studylib.cpuinfo import cpu_flags
    from studylib.workbook.isa_words import bf16_units

    units = bf16_units(cpu_flags() if flags is None else flags)
    return ("Every arm is loaded side by side. `awq4` is Q4_0 with activation-aware scales (AWQ; Q4_0 because "
            "re-quantising this model to Q4_1 gives back its own blocks, leaving AWQ nothing to improve): channels that "
            "carry large activations are scaled up before rounding and the inverse scale is folded into the "
            "preceding RMSNorm (or the up projection), chosen per layer by a grid search on calibration text from "
            "NarrativeQA. The embedding and head stay Q8_0 in every re-quantised format, as in the GGUF file. "
            "`gguf+bf16prefill` is `gguf` whose long steps (prefill) multiply in bf16 in the BLAS GEMM, on the "
            f"CPU's native bf16 instructions where it has them ({units}): "
            "decode stays exact, the prompt's KV carries bf16 rounding. `kv_int8` keeps the fp32 weights and "
            "stores the KV cache in 8 bits instead (one scale per token and head): it shrinks what a token costs "
            "to keep and to read at every later step, which matters at long context and large batch rather than "
            "for short chats.")


def identity_text(identity: dict | None) -> str:
    if identity is None:
        return "No `gguf` arm in this run (it exists for the embedded model only), so no identity check."
    n, k = identity["prompts"], identity["identical"]
    if k == n:
        return (f"**Greedy output of `gguf` equals dense fp32 token for token on {k} of {n} prompts.** The two "
                "compute with the same weights; only the order of the fp32 sums differs.")
    where = ", ".join(f"prompt {f['prompt']} at token {f['first_difference']}" for f in identity["flips"])
    return (f"**Greedy output of `gguf` equals dense fp32 on {k} of {n} prompts.** The others part at: {where}. "
            "Both arms hold the same weights, so a flip can only come from the order of fp32 sums deciding a "
            "near-tie between the top two tokens; once one token differs, the continuations diverge.")


def _value_ci(value: float, low: float, high: float, fmt: str = ".2f") -> str:
    """A value with its CI in brackets, or the value alone where the CI is not shown (``speed_summary``)."""
    if np.isfinite([low, high]).all():
        return f"{value:{fmt}} [{low:{fmt}}, {high:{fmt}}]"
    return f"{value:{fmt}} (no CI at this level)"


def frontier_text(table: pd.DataFrame, exact: Sequence[str] = ()) -> str:
    """The frontier in words, from ``table`` (``combined``); ``exact`` (``exact_arms``) are the arms with
    the reference's own weights, which are the reference's quality by construction and so are left out of
    "closest to the reference"."""
    t = table[~table.arm.isin([BASELINE, *SPEED_ONLY])].set_index("arm")
    if t.empty:
        return "Only the reference ran."
    fastest = t.speedup.idxmax()
    conf = float(table.confidence.iloc[0]) if "confidence" in table else 0.95
    text = (f"The fastest format per token is **{fastest}**, {t.loc[fastest, 'speedup']:.2f}x dense fp32 "
            + (f"({conf:.2%} CI {t.loc[fastest, 'speedup_low']:.2f}-{t.loc[fastest, 'speedup_high']:.2f}), at "
               if np.isfinite([t.loc[fastest, "speedup_low"], t.loc[fastest, "speedup_high"]]).all() else
               f"(too few prompts in this one process for a CI at {conf:.2%}; the whole runs below decide), at ")
            + f"{t.loc[fastest, 'bits_per_weight']:.1f} bits per weight over every matrix a step reads (the tied "
            "embedding and head included, which stay Q8_0 at 8.5 bits; a Q4_1 block alone is 5); it reaches "
            f"{t.loc[fastest, 'fraction_of_roofline']:.0%} of its bandwidth roofline. ")
    lossy = t[~t.index.isin(list(exact))]
    if not lossy.empty:
        closest = lossy.kl_mean.idxmin()
        held = [a for a in t.index if a in exact]
        same = f" ({_names(held)} {'holds' if len(held) == 1 else 'hold'} the reference's own weights)" if held else ""
        text += (f"Of the formats that change the weights or the arithmetic{same}, the closest to the reference is "
                 f"**{closest}** (mean KL {t.loc[closest, 'kl_mean']:.2g} nats/token, top-1 agreement "
                 f"{t.loc[closest, 'top1']:.1%}, next-word accuracy ratio {t.loc[closest, 'task_ratio']:.3f}). ")
    return text + (f"Prefill does not speed up with the weights' size (`{fastest}`: "
                   f"{t.loc[fastest, 'prefill_speedup']:.2f}x): a long prompt is bound by arithmetic, and every "
                   "prefill forward dequantises each matrix to fp32 and hands it to the same GEMM as the reference.")


def _names(arms: Sequence[str]) -> str:
    arms = [f"`{a}`" for a in arms]
    return arms[0] if len(arms) == 1 else ", ".join(arms[:-1]) + " and " + arms[-1]


def _words_n(n: int, word: str = "word") -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def scope_text(fp: pd.DataFrame, model: str = "smollm2-135m") -> str:
    """What this model lets the chapter measure, from the footprint table: which arms hold exactly the
    reference's weights (relative weight error 0) and which change them. For the embedded model (the one
    with a GGUF file), that its dense fp32 weights are its 4-bit blocks widened."""
    from studylib.errors import StudylibError
    from studylib.models.weights import check_weights

    try:
        embedded = check_weights("gguf", model) == "gguf"
    except StudylibError:
        embedded = False
    exact = exact_arms(fp)
    bits = fp.set_index("arm").bits_per_weight
    changed = [a for a in fp.arm if a not in (BASELINE, *SPEED_ONLY) and a not in exact]
    one = len(exact) == 1
    text = "**What this model lets us measure.** "
    if embedded:
        text += ("The embedded model is distributed in 4-bit: its GGUF file stores the linears as Q4_1 blocks "
                 "(the embedding as Q8_0), and the dense fp32 reference is those blocks widened. How much the "
                 "4-bit distribution lost against its bf16 original cannot be measured with this model: there "
                 "is no bf16 original here to compare with. ")
    if exact:
        text += (f"{_names(exact)} {'holds' if one else 'hold'} exactly the reference's values (relative weight "
                 f"error 0 in the table above) and {'computes' if one else 'compute'} like it, so "
                 f"{'it is' if one else 'they are'} the reference read from fewer bytes "
                 f"({', '.join(f'`{a}` {bits[a]:.1f}' for a in exact)} bits per weight over a step's matrices, the 8.5-bit "
                 f"head included, against its {bits[BASELINE]:.0f}): {'its' if one else 'their'} quality equals the reference's by "
                 "construction, and the rows are shown, never counted. What is measured instead: the speed of "
                 "keeping the native format rather than widening it, and the speed and the loss of compressing "
                 "further or changing the arithmetic")
    else:
        text += ("No arm in this run holds exactly the reference's weights. Measured: the speed and the loss of "
                 "compressing or changing the arithmetic")
    return text + (f" ({_names(changed)}): these arms decide C9." if changed else
                   "; no such arm ran here, so nothing can decide C9.")


def task_text(task: pd.DataFrame, exact: Sequence[str] = ()) -> str:
    """The next-word task in words, from ``word_task_summary``: the reference's score and chance, each
    deciding arm's ratio and CI, and for a CI too wide to see the bar how many documents would decide it."""
    t = task.set_index("arm")
    if BASELINE not in t.index:
        return "The reference did not run the task."
    ref = t.loc[BASELINE]
    conf = float(ref.confidence)
    text = (f"The reference predicts {ref.reference_acc:.1%} of {int(ref.words)} words right over {int(ref.n)} "
            f"documents (a uniform guesser: {ref.chance:.1g}). Words right relative to the reference, "
            f"{conf:.2%} CI over documents:")
    arms = [a for a in t.index if a != BASELINE and a not in exact]
    if not arms:
        return text + " no arm that changes the weights or the arithmetic ran."
    parts = []
    for a in arms:
        r = t.loc[a]
        if math.isnan(r.task_ratio_low):
            parts.append(f"`{a}` {r.task_ratio:.3f} (no CI from {int(r.n)} documents)")
        else:
            parts.append(f"`{a}` {r.task_ratio:.3f} [{r.task_ratio_low:.3f}, {r.task_ratio_high:.3f}] "
                         f"({_words_n(int(r.discordant))} right for only one of the two)")
    text += " " + "; ".join(parts) + "."
    weak = [a for a in arms if not t.loc[a, "has_power"] and t.loc[a, "n_needed"] is not None
            and not pd.isna(t.loc[a, "n_needed"]) and not t.loc[a, "task_ratio_high"] < 0.99]
    if weak:
        text += (" Too wide to see a 1% change (half-width above 0.01): " + "; ".join(
            f"`{a}` (half-width {t.loc[a, 'mdc']:.3f}; about {int(t.loc[a, 'n_needed'])} documents of this length "
            "would decide it)" for a in weak) + ". These rows read \"inconclusive: no power\", not \"holds\".")
    same = [a for a in t.index if a in exact]
    if same:
        text += (" For comparison, the reference's own weights: " + "; ".join(
            f"`{a}` {_words_n(int(t.loc[a, 'discordant']))} right for only one of the two" for a in same) + ".")
    return text


def verdict_text(verdicts: Sequence[Verdict]) -> str:
    """The decision in words, from the rows ``judge_c9`` returned: which formats decide, how each came out,
    and which rows were shown but not counted."""
    if not verdicts:
        return ""
    decision, rest = verdicts[0], verdicts[1:]
    comps = [v for v in rest if ": >= " in v.metric]
    counted = [v for v in comps if not v.by_construction]
    shown = [v.metric.split(":")[0] for v in comps if v.by_construction]
    text = f"**C9 in this chapter: {decision.verdict}.** "
    if counted:
        text += "Per format that changes the weights or the arithmetic: " + "; ".join(
            f"`{v.metric.split(':')[0]}` {v.verdict}" for v in counted) + ". "
    else:
        text += "No format that changes the weights or the arithmetic ran, so nothing here can decide C9. "
    if shown:
        text += (f"Shown, not counted: `{'`, `'.join(shown)}` (the reference's own weights; their speed-up is the "
                 "speed of keeping the native 4-bit format, not evidence about a loss). ")
    nopower = [v for v in rest if v.power and not v.power.get("has_power", True) and v.verdict != FAILS]
    if nopower:
        def needed(v: Verdict) -> str:
            n = v.power.get("n_needed")
            return f"about {n} documents would decide it" if n is not None else "no CI"

        text += ("Quality could not be decided for lack of power on " + "; ".join(
            f"`{v.metric.rsplit(', ', 1)[-1]}` ({needed(v)})" for v in nopower) + ".")
    return text.strip()



def step_cost_text(cost: pd.DataFrame) -> str:
    parts = []
    for arm, g in cost.groupby("arm", sort=False):
        g = g.sort_values("rows")
        top = g.iloc[-1]
        parts.append(f"`{arm}`: {g.iloc[0].ms:.1f} ms for one row, {top.ms:.1f} ms for {int(top.rows)} "
                     f"(v({int(top.rows)}) = {top.verify_cost:.2f})")
    return ("Measured step times: " + "; ".join(parts) + ". Once a step reads fewer bytes, the arithmetic per row "
            "is no longer hidden behind the weight reads, and extra rows cost real time sooner. Part of that is "
            "this kernel's design rather than 4-bit storage itself: it widens each block again for every tile "
            "of 4 rows and computes attention per row and head, so v(n) here is an upper bound on what a "
            "4-bit engine must pay. Speculative verification of many tokens is relatively dearer on it, even "
            "though every step is cheaper in absolute terms.")


PEER_FILE, PEER_PROMPTS = "llama_cpp.json", "ch08_prompts.jsonl"


def export_peer_prompts(out_dir, prompts: Sequence[Sequence[int]], decode: pd.DataFrame, new_tokens: int,
                        arm: str = "gguf") -> Path | None:
    """Write the decode prompts (token ids) and our ``arm``'s greedy tokens for the llama.cpp peer
    (``benchmarks/peers/llamacpp_peer.py``) to ``<out_dir>/peers/ch08_prompts.jsonl``."""
    import json

    if arm not in set(decode.arm):
        return None
    path = Path(out_dir) / "peers" / PEER_PROMPTS
    path.parent.mkdir(parents=True, exist_ok=True)
    ours = decode[decode.arm == arm].set_index("prompt").tokens
    lines = [json.dumps({"id": i, "prompt_token_ids": list(map(int, ids)), "max_new_tokens": new_tokens,
                         "ours": list(map(int, ours[i]))}) for i, ids in enumerate(prompts)]
    path.write_text("\n".join(lines) + "\n")
    return path


def peer_frame(out_dir, decode: pd.DataFrame, arms: Sequence[str] = ("gguf", "gguf@int8")) -> tuple[pd.DataFrame | None, str]:
    """llama.cpp beside each of our ``arms`` (those in the run) on the same prompts, if the peer's JSON is
    present: decode tok/s, ours / theirs paired per prompt, and how many greedy outputs agree. Returns
    (table, text)."""
    import json

    from studylib.experiments.ch05_interplay import reports_folder

    path = reports_folder(out_dir) / "peers" / PEER_FILE
    if not path.exists():
        return None, ("No llama.cpp run was found beside this chapter's results: the peer runs in its own "
                      "environment (the README's Peers section says how), on the prompts this chapter exported, "
                      "and this section shows it when that run has left its results here.")
    peer = json.loads(path.read_text())
    from studylib.bench.provenance import other_machine

    elsewhere = other_machine(peer)
    if elsewhere:
        return None, (f"llama.cpp is not compared here, because {elsewhere}: a side-by-side needs both "
                      "engines on one machine. Rerun the peer here on this run's exported prompts "
                      "(the README's Peers section says how).")
    theirs = {int(r["id"]): r for r in peer["prompts"]}
    arms = [a for a in arms if a in set(decode.arm)]
    rows, parts = [], []
    for arm in arms:
        ours = decode[decode.arm == arm].set_index("prompt")
        ids = [i for i in ours.index if i in theirs]
        if len(ids) < len(ours):
            return None, f"`{path}` covers {len(ids)} of {len(ours)} prompts; rerun the peer on this run's export."
        t_ours = [float(ours.loc[i, "decode_s_per_token"]) for i in ids]
        t_peer = [float(theirs[i]["decode_s_per_token"]) for i in ids]
        ratio = ratio_estimate(t_peer, t_ours)  # > 1: ours is faster
        e_ours = estimate([1 / t for t in t_ours])
        # Agreement against this run's tokens (not the peer's own flag, which compared with the export).
        same = sum(list(theirs[i].get("tokens", [])) == list(ours.loc[i, "tokens"]) for i in ids)
        rows.append({"engine": f"studylib ({arm})", "decode_tok_s": e_ours.value, "ci_low": e_ours.ci_low,
                     "ci_high": e_ours.ci_high, "vs_llama_cpp": ratio.value, "vs_low": ratio.ci_low,
                     "vs_high": ratio.ci_high, "greedy_identical": f"{same}/{len(ids)}"})
        parts.append(f"`{arm}` decodes at {ratio.value:.2f}x llama.cpp's tokens/s (CI {ratio.ci_low:.2f}-"
                     f"{ratio.ci_high:.2f}, n={ratio.n} prompts) and agrees greedily on {same} of {len(ids)} prompts")
    if not rows:
        return None, "None of the compared arms ran in this profile."
    e_peer = estimate([1 / float(theirs[i]["decode_s_per_token"]) for i in ids])
    rows.append({"engine": f"llama.cpp {peer.get('llama_cpp_python', '')}", "decode_tok_s": e_peer.value,
                 "ci_low": e_peer.ci_low, "ci_high": e_peer.ci_high})
    text = (f"On the same GGUF file, prompts and {peer.get('threads')} threads: " + "; ".join(parts) + ". "
            f"llama.cpp ran separately in its own environment, on this chapter's exported prompts, at {peer.get('date')} "
            f"(`{path.name}`). It rounds the activations to 8 bits per block before its integer dot products, as "
            "`gguf@int8` does (with fp16 rather than fp32 scales and its own summation order), so neither of our arms "
            "is its model exactly.")
    return pd.DataFrame(rows), text


def anchors_frame() -> pd.DataFrame:
    """Published figures to read ours against (their models and machines, not ours)."""
    return pd.DataFrame([
        {"source": "AWQ (Lin et al., MLSys 2024), Table 4", "setting": "Llama-2-7B, WikiText-2 perplexity, INT4 g128",
         "figure": "FP16 5.47; RTN 5.73; GPTQ 5.69; AWQ 5.60"},
        {"source": "llama.cpp quantize tool (Q4_0 / Q4_1 / Q8_0 formats)",
         "setting": "block formats of 32 weights; Q8_0 is near-lossless, Q4_0 the cheapest",
         "figure": "bits per weight: Q4_0 4.5, Q4_1 5.0, Q8_0 8.5"},
        {"source": "KIVI (Liu et al., ICML 2024)", "setting": "2-bit KV cache, per-channel keys / per-token values",
         "figure": "KV memory 2.6x smaller, throughput up to 3.5x (their GPUs)"},
    ])


def measurements(fp, speed, quality, task, identities, cost_summary, probe, fusion=None, decode=None, prefill=None,
                 per_document=None) -> dict:
    """The chapter's measurements for its JSON (``task`` is ``word_task_summary``'s next-word task); with
    ``decode`` / ``prefill`` / ``per_document`` also the per-prompt and per-document data the CIs came from."""
    drop = ["estimate"]
    return {"footprint": fp.to_dict("records"), "fusion": None if fusion is None else fusion.to_dict("records"),
            "speed": speed.drop(columns=drop).to_dict("records"),
            "quality": quality.to_dict("records"),
            "next_word_task": task.drop(columns=drop).to_dict("records"),
            "greedy_identity": identities, "step_cost": cost_summary.to_dict("records"), "probe": probe,
            **({"decode_runs": decode.drop(columns=["tokens"], errors="ignore").to_dict("records")} if decode is not None else {}),
            **({"prefill_runs": prefill.to_dict("records")} if prefill is not None else {}),
            **({"next_word_per_document": per_document} if per_document is not None else {})}
