"""Chapter 3 measurements: Jacobi and lookahead decoding against our AR decoder.

Every function returns a pandas DataFrame (or a dict) so the notebook only calls and displays.
Timing is paired: for each prompt the AR baseline and every method run back to back in the same
process, so ``ratio_estimate`` compares like with like.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from studylib.bench.stats import estimate, ratio_estimate, rotated
from studylib.decoding import ar, jacobi, lookahead
from studylib.models import (
    DenseKVCache,
    LlamaModel,
    arithmetic,
)
from studylib.progress import progress_bar
from studylib.workbook import illustration as ill

# Published numbers, printed beside ours. "speedup" is wall-clock over the authors' AR baseline.
ANCHORS = [
    {"method": "jacobi", "source": "Santilli et al. 2023 (ACL)", "speedup": "up to 1.38x (\"up to 38% faster\")",
     "model": "MT transformers (Opus-MT, MBart50)", "hardware": "GPU", "training": "none"},
    {"method": "lookahead", "source": "Fu et al. 2024 (ICML), authors", "speedup": "1.5-2.3x",
     "model": "LLaMA-2-chat 7B-70B, CodeLlama", "hardware": "A100", "training": "none"},
    {"method": "lookahead", "source": "Spec-Bench (Xia et al. 2024)", "speedup": "1.13-1.27x",
     "model": "Vicuna-7B", "hardware": "A100 / RTX 3090", "training": "none"},
    {"method": "CLLM (Jacobi)", "source": "Kou et al. 2024 (ICML)", "speedup": "2.4-3.4x",
     "model": "fine-tuned consistency LLMs (7B)", "hardware": "A100",
     "training": "consistency fine-tuning (named, not reproduced)"},
]


def anchors_frame(summary: pd.DataFrame | None = None, methods: Sequence[str] = (), model: str = "",
                  hardware: str = "") -> pd.DataFrame:
    """The published anchors, followed by our measured speedups for ``methods`` (one row each, the
    range over workloads) when a summary is given."""
    rows = list(ANCHORS)
    if summary is not None:
        for m in methods:
            g = summary[summary.method == m]
            if len(g):
                rows.append({"method": m, "source": "this study (measured)",
                             "speedup": f"{g.speedup.min():.2f}-{g.speedup.max():.2f}x "
                                        f"({', '.join(g.workload)})",
                             "model": model, "hardware": hardware, "training": "none"})
    return pd.DataFrame(rows)


def conditions_text(model: LlamaModel, prompts: Sequence[Prompt], max_new_tokens: int) -> str:
    import os

    wl = ", ".join(f"{w} x{n}" for w, n in pd.Series([p.workload for p in prompts]).value_counts().items())
    return (f"{model.config.name} ({arithmetic(model)}) on {model.device.type} "
            f"({os.cpu_count()} cores, {torch.get_num_threads()} threads); greedy, {max_new_tokens} new tokens; "
            f"prompts: {wl}")


# ------------------------------------------------------------------------------------------- workloads


@dataclass
class Prompt:
    id: str
    workload: str  # chat | xsum | humaneval
    category: str
    ids: list[int] = field(repr=False)


def load_prompts(tokenizer, workloads: Mapping[str, int], seed: int = 0, max_chars: int = 1500) -> list[Prompt]:
    """Token ids for ``{workload: n}`` (chat prompts go through the chat template, HumanEval is plain
    completion, XSum articles longer than ``max_chars`` are skipped so CPU prefill stays short)."""
    from studylib.data import load_workload
    from studylib.prompts import encode

    out = []
    for name, n in workloads.items():
        if n <= 0:
            continue
        for rec in load_workload(name, n, seed, max_chars=max_chars if name != "chat" else None):
            chat = rec.messages is not None
            out.append(Prompt(rec.id, name, rec.category or name, encode(tokenizer, rec, chat=chat)))
    return out


def prompt_table(prompts: Sequence[Prompt]) -> pd.DataFrame:
    df = pd.DataFrame([{"workload": p.workload, "category": p.category, "tokens": len(p.ids)} for p in prompts])
    return df.groupby(["workload", "category"], as_index=False, sort=False).agg(
        prompts=("tokens", "size"), mean_prompt_tokens=("tokens", "mean")).round(1)


# ------------------------------------------------------------------------------------------- methods


def parse_config(spec: str) -> tuple[str, dict]:
    """``"ar"``, ``"jacobi:B"`` / ``"jacobi:B:init"``, ``"lookahead:W,N,G"`` or ``"lookahead:W,N,G+prompt"``
    -> (decoder module name, options). A string keeps notebook parameters papermill-friendly."""
    name, _, arg = spec.partition(":")
    if name == "ar":
        return "ar", {}
    if name == "jacobi":
        block, _, init = arg.partition(":")
        return "jacobi", {"block": int(block), "init": init or "pad"}
    if name == "lookahead":
        nums, plus, _ = arg.partition("+")
        w, n, g = (int(x) for x in nums.split(","))
        return "lookahead", {"window": w, "ngram": n, "guesses": g, "prompt_pool": bool(plus)}
    raise ValueError(f"unknown method spec {spec!r}; use ar, jacobi:B[:init], lookahead:W,N,G[+prompt]")


_DECODERS = {"ar": ar.generate, "jacobi": jacobi.generate, "lookahead": lookahead.generate}


def decode(model, tok, spec: str, ids: list[int], max_new_tokens: int):
    method, opts = parse_config(spec)
    return _DECODERS[method](model, ids, max_new_tokens, tokenizer=tok, **opts)


def flops(model: LlamaModel, res) -> float:
    """Decode FLOPs of one result: 2 * params per token in each forward, plus attention QK^T and PV
    (4 * layers * heads * head_dim per query-key pair) over the context the forward sees."""
    c = model.config
    per_pair = 4 * c.num_layers * c.num_heads * c.head_dim
    sizes = res.extra.get("forward_tokens") or [res.prompt_tokens] + [1] * (res.target_forwards - 1)
    total, ctx = 0.0, res.prompt_tokens
    for t, acc in zip(sizes[1:], res.accepted_lengths, strict=False):
        total += 2.0 * c.num_params * t + per_pair * t * (ctx + t)
        ctx += acc
    return total


def run_methods(model, tok, prompts: Sequence[Prompt], specs: Sequence[str], max_new_tokens: int,
                repeats: int = 1, warmup: bool = True, show_progress: bool = True) -> pd.DataFrame:
    """One row per (prompt, method, repeat). AR is the reference for exact equality; the arms run in an
    order that rotates per prompt; wall time is the decoder's own end-to-end clock (prefill included)."""
    specs = ["ar", *[s for s in specs if s != "ar"]]
    if warmup and prompts:
        for s in specs:
            decode(model, tok, s, prompts[0].ids[:32], 4)
    rows = []
    for i, p in enumerate(progress_bar(prompts, desc="ch03 methods", leave=False, progress=show_progress)):
        for r in range(repeats):
            # Arms interleaved: the methods' order rotates per prompt and repeat, so drift in machine
            # load falls on every arm alike; AR stays the reference whatever its turn.
            results = {s: decode(model, tok, s, p.ids, max_new_tokens) for s in rotated(specs, i + r)}
            ref = results["ar"].token_ids
            for s in specs:
                res = results[s]
                fwd = res.extra.get("forward_tokens", [])
                rows.append({
                    "prompt": p.id, "workload": p.workload, "category": p.category, "method": s,
                    "family": parse_config(s)[0], "repeat": r, "prompt_tokens": len(p.ids),
                    "new_tokens": res.new_tokens, "target_forwards": res.target_forwards,
                    "compression": res.new_tokens / res.target_forwards,  # AR: exactly 1
                    "wall_s": res.wall_s, "decode_s": res.wall_s - res.ttft_s,
                    "tokens_per_forward": float(np.mean(fwd[1:])) if len(fwd) > 1 else 1.0,
                    "flops_per_token": flops(model, res) / max(res.new_tokens - 1, 1),
                    "equal_to_ar": res.token_ids == ref,
                })
    return pd.DataFrame(rows)


def _per_prompt(df: pd.DataFrame) -> pd.DataFrame:
    # One value per prompt (the median over its repeats), so each prompt counts once in the bootstrap.
    return df.groupby(["workload", "prompt", "method"], as_index=False, sort=False).agg(
        wall_s=("wall_s", "median"), decode_s=("decode_s", "median"), compression=("compression", "median"),
        flops_per_token=("flops_per_token", "median"), tokens_per_forward=("tokens_per_forward", "median"),
        equal_to_ar=("equal_to_ar", "all"), new_tokens=("new_tokens", "median"))


def summarise(df: pd.DataFrame, by_workload: bool = True, confidence: float = 0.95) -> pd.DataFrame:
    """Per (workload, method): compression and paired wall-clock speedup over AR, each with a CI at
    ``confidence`` (95% for the tables; the decision's corrected level in ``c3_verdicts``), FLOPs per
    token relative to AR, and whether every output equalled AR's."""
    pp = _per_prompt(df)
    keys = ["workload"] if by_workload else []
    rows = []
    for key, g in (pp.groupby(keys, sort=False) if keys else [("all", pp)]):
        base = g[g.method == "ar"].set_index("prompt")
        for m, gm in g.groupby("method", sort=False):
            gm = gm.set_index("prompt").loc[base.index]
            comp = estimate(gm.compression, confidence=confidence)
            sp = ratio_estimate(base.wall_s.values, gm.wall_s.values, confidence=confidence)
            dec = ratio_estimate(base.decode_s.values, gm.decode_s.values, confidence=confidence)
            rows.append({
                "workload": key[0] if isinstance(key, tuple) else key, "method": m, "prompts": len(gm),
                "compression": comp.value, "compression_lo": comp.ci_low, "compression_hi": comp.ci_high,
                "compression_mc": comp.mc_error, "compression_method": comp.method,
                "speedup": sp.value, "speedup_lo": sp.ci_low, "speedup_hi": sp.ci_high,
                "decode_speedup": dec.value, "decode_lo": dec.ci_low, "decode_hi": dec.ci_high,
                "tokens_per_forward": float(gm.tokens_per_forward.median()),
                "gflops_per_token": float(gm.flops_per_token.median() / 1e9),
                "flops_vs_ar": float(gm.flops_per_token.median() / base.flops_per_token.median()),
                "exact": bool(gm.equal_to_ar.all()),
            })
    return pd.DataFrame(rows)


def _ci(v: float, lo: float, hi: float) -> str:
    return f"{v:.2f} [{lo:.2f}, {hi:.2f}]"


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with each estimate and its CI in one readable cell."""
    return pd.DataFrame({
        "workload": summary.workload, "method": summary.method, "prompts": summary.prompts,
        "compression [95% CI]": [_ci(*r) for r in summary[["compression", "compression_lo", "compression_hi"]].values],
        "speedup [95% CI]": [_ci(*r) for r in summary[["speedup", "speedup_lo", "speedup_hi"]].values],
        "decode-only speedup": [_ci(*r) for r in summary[["decode_speedup", "decode_lo", "decode_hi"]].values],
        "tokens/forward": summary.tokens_per_forward.round(1), "exact": summary.exact,
    })


def flops_table(summary: pd.DataFrame) -> pd.DataFrame:
    cols = ["workload", "method", "tokens_per_forward", "compression", "gflops_per_token", "flops_vs_ar"]
    return summary[cols].round(3).rename(columns={"gflops_per_token": "GFLOPs per accepted token",
                                                   "flops_vs_ar": "x AR's FLOPs"})


# ------------------------------------------------------------------------------------------- sweep


def sweep(model, tok, prompts: Sequence[Prompt], windows: Sequence[int], ngrams: Sequence[int],
          guesses: Sequence[int], max_new_tokens: int, prompt_pool: bool = False) -> pd.DataFrame:
    """Lookahead over the (W, N, G) grid: per config, median compression and paired speedup over AR. On fewer
    than ``MIN_UNITS`` prompts (all workloads together) the sweep is an illustration
    (``studylib.workbook.illustration``): no CI columns, labelled with n."""
    specs = [f"lookahead:{w},{n},{g}" + ("+prompt" if prompt_pool else "")
             for w in windows for n in ngrams for g in guesses]
    df = run_methods(model, tok, prompts, specs, max_new_tokens)
    s = summarise(df, by_workload=False)
    s = s[s.method != "ar"].copy()
    parsed = s.method.map(lambda m: parse_config(m)[1])
    s["W"], s["N"], s["G"] = parsed.map(lambda o: o["window"]), parsed.map(lambda o: o["ngram"]), parsed.map(
        lambda o: o["guesses"])
    return ill.illustration(s.reset_index(drop=True), int(df.prompt.nunique()), "prompts")


# ------------------------------------------------------------------------------------------- cost model


def step_time_curve(model: LlamaModel, sizes: Sequence[int], context: int = 256, repeats: int = 5) -> pd.DataFrame:
    """Seconds for ONE forward of T new tokens after ``context`` cached tokens, for each T in ``sizes``
    (median and 95% CI over ``repeats``). Chapter 1 varies the batch; parallel decoding varies T."""
    c = model.config
    dev = model.device
    cache = DenseKVCache(c, 1, context + max(sizes), dev, model.dtype)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, c.vocab_size, (1, context), generator=gen).to(dev)
    model(prefix, cache.begin(context), logits="none")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows = []
    for T in progress_bar(sizes, desc="step time", leave=False):
        x = torch.randint(3, c.vocab_size, (1, T), generator=gen).to(dev)
        mask = torch.ones(T, T, dtype=torch.bool).tril()  # a tree mask, as lookahead passes one
        times = []
        for i in range(repeats + 1):
            sync()
            t0 = time.perf_counter()
            model(x, cache.begin(T, tree_mask=mask), logits="all")
            sync()
            if i:  # the first call warms up this shape
                times.append(time.perf_counter() - t0)
            cache.truncate(context)
        e = estimate(times)
        rows.append({"T": T, "seconds": e.value, "lo": e.ci_low, "hi": e.ci_high})
    df = pd.DataFrame(rows)
    df["relative"] = df.seconds / float(df.loc[df["T"].idxmin(), "seconds"])
    return df


def roofline_curve(model: LlamaModel, sizes: Sequence[int], bandwidth_gbs: float = 3350.0,
                   peak_tflops: float = 989.0, bytes_per_param: int = 2) -> pd.DataFrame:
    """Roofline time of one forward on an H100-SXM-like GPU (bf16): max(weights / bandwidth, FLOPs / peak).
    A model, not a measurement: it shows why extra tokens per forward are nearly free there."""
    p = model.config.num_params
    t = [max(p * bytes_per_param / (bandwidth_gbs * 1e9), 2.0 * p * T / (peak_tflops * 1e12)) for T in sizes]
    df = pd.DataFrame({"T": list(sizes), "seconds": t})
    df["relative"] = df.seconds / df.seconds.iloc[int(np.argmin(sizes))]
    return df


def _relative_at(curve: pd.DataFrame, T: float) -> float:
    return float(np.interp(T, curve["T"], curve["relative"]))


def cost_model(summary: pd.DataFrame, curve: pd.DataFrame, gpu_curve: pd.DataFrame | None = None) -> pd.DataFrame:
    """Predicted speedup = compression / (t(T) / t(1)), with T the mean tokens per forward: a method
    pays off only when it accepts more tokens per forward than the forward's relative cost.
    ``break_even`` is that relative cost: the compression needed just to match AR on this machine."""
    s = summary[summary.method != "ar"].copy()
    s["break_even"] = s.tokens_per_forward.map(lambda T: _relative_at(curve, T))
    s["predicted_speedup"] = s.compression / s.break_even
    if gpu_curve is not None:
        s["gpu_roofline_speedup"] = s.compression / s.tokens_per_forward.map(lambda T: _relative_at(gpu_curve, T))
    cols = ["workload", "method", "tokens_per_forward", "compression", "break_even", "predicted_speedup",
            "speedup", "flops_vs_ar"] + (["gpu_roofline_speedup"] if gpu_curve is not None else [])
    return s[cols].reset_index(drop=True)


# ------------------------------------------------------------------------------------------- trajectory


def jacobi_trajectory(model, tok, ids: list[int], block: int = 8, max_new_tokens: int = 24,
                      init: str = "pad") -> pd.DataFrame:
    """Long-form Jacobi trajectory: one row per (block, iteration, position) with the token guessed
    there, whether it already equals the final token, and whether it was committed."""
    res = jacobi.generate(model, ids, max_new_tokens, tokenizer=tok, block=block, init=init, trace=True)
    rows = []
    for b, blk in enumerate(res.extra["trajectory"]):
        for st in blk["states"]:
            for pos, t in enumerate(st["tokens"]):
                final = blk["final"][pos] if pos < len(blk["final"]) else None
                rows.append({"block": b, "iteration": st["iter"], "position": pos, "token": t,
                             "text": tok.decode([t]), "correct": t == final, "fixed": pos < st["fixed"]})
    return pd.DataFrame(rows)


def convergence_table(traj: pd.DataFrame) -> pd.DataFrame:
    """Per block position: the first iteration whose guess was already right, and the iteration that
    committed it (always >= the first; Jacobi commits only a verified prefix)."""
    right = traj[traj.correct].groupby(["block", "position"]).iteration.min().rename("first_correct")
    fixed = traj[traj.fixed].groupby(["block", "position"]).iteration.min().rename("committed")
    return pd.concat([right, fixed], axis=1).reset_index()


# ------------------------------------------------------------------------------------------- verdicts


def timing_run(model: str, weights: str, act: str, workloads: Mapping[str, int], method: str, max_new_tokens: int,
               bandwidth_gbs: float, seed: int = 0, max_chars: int = 1500, device: str = "cpu", dtype: str = "float32",
               **_) -> dict:
    """Chapter 3's timing section as one whole run (``studylib.bench.whole_runs``): in a fresh process,
    load the engine, decode every prompt with AR and ``method`` (arms rotated per prompt) and return, per
    workload, this run's paired speed-up (the median AR time over the median ``method`` time, as
    ``ratio_estimate``'s point) and tokens per forward. Exactness is checked by the chapter's main run,
    not here."""
    from studylib.models import load_model

    lm, tok = load_model(model, device, dtype, weights=weights, act=act)
    prompts = load_prompts(tok, dict(workloads), seed=seed, max_chars=max_chars)
    df = run_methods(lm, tok, prompts, [method], max_new_tokens, show_progress=False)
    pp = _per_prompt(df)
    out = {}
    for w, g in pp.groupby("workload", sort=False):
        base = g[g.method == "ar"].set_index("prompt")
        arm = g[g.method == method].set_index("prompt").loc[base.index]
        out[f"speedup:{w}"] = float(base.wall_s.median() / arm.wall_s.median())
        out[f"compression:{w}"] = float(arm.compression.median())
    return out


def c3_confidence(chapter: int = 3) -> tuple[float, int]:
    """The level of every C3 CI here and how many conditions it is corrected for: Bonferroni over every
    workload and configuration C3 declares in chapters 2 and 3 (``decisions.level``): any one clearing would
    carry the study's line."""
    from studylib.decisions import level

    return level("C3", chapter)


def speed_over_runs(runs, summary: pd.DataFrame, method: str, confidence: float = 0.95) -> dict:
    """Per workload, the speed-up's CI over whole runs at ``confidence``, keyed as ``c3_verdicts`` takes it."""
    from studylib.bench.stats import no_ci

    # a workload the runs did not measure stays a condition, with no CI: it cannot clear the bar unseen
    return {w: runs.get(f"speedup:{w}", confidence) or no_ci(confidence=confidence)
            for w in summary.loc[summary.method == method, "workload"]}


def c3_verdicts(summary: pd.DataFrame, method: str, chapter: int = 3, conditions: str = "",
                speed_runs: Mapping | None = None, runs_note: str = "", per_prompt: pd.DataFrame | None = None,
                timing=None) -> list:
    """C3 from this chapter: one decision over the parts that must all hold for ``method`` (declared in
    the parameters, not picked after the run): exactness of every method (all or nothing), new tokens
    per target forward >= 1.1 (CI over prompts: a count of tokens, the same in every process) and a
    wall-clock speedup > 1 per workload. The speed-up is a machine-level number: it is judged over whole
    runs (``speed_runs``, one median per run and workload, t on their logs), the main run's prompt-level
    CIs shown beside it; without whole runs the prompt-level CI is judged, and as repeats are declared
    it rests on too few units to decide.

    The workloads are a family (any one clearing carries a part): with the per-prompt rows
    (``per_prompt``, ``run_methods``' frame) and the whole runs (``timing``), every CI is recomputed at the
    Bonferroni level for the declared workloads (``c3_confidence``) and the rows record ``tried``; without
    them the rows are judged at the level ``summary`` carries and say they are uncorrected."""
    from studylib.claims import decide_parts, judge_at_least, judge_checks

    s = summary[summary.method != "ar"]
    exact = {f"{r.method} on {r.workload} ({r.prompts} prompts)": r.exact for r in s.itertuples()}
    confidence, k = c3_confidence(chapter)
    corrected = k > 1 and per_prompt is not None and (speed_runs is None or timing is not None)
    if corrected:
        sc = summarise(per_prompt, confidence=confidence)
        sc = sc[sc.method == method]
        if timing is not None:
            speed_runs = speed_over_runs(timing, sc, method, confidence)
    else:
        sc, confidence = s, 0.95
    tried = k if corrected else None
    family = (f"each CI at {confidence:.2%}, Bonferroni over the {k} declared workloads" if corrected else
              f"CIs at 95%, not corrected for the {k} workloads (no per-prompt rows or runs given)" if k > 1 else "")
    conditions_c = "; ".join(x for x in (conditions, family) if x)
    m = sc[sc.method == method]
    comp = {r.workload: {"value": r.compression, "ci_low": r.compression_lo, "ci_high": r.compression_hi,
                         "n": r.prompts, "mc_error": getattr(r, "compression_mc", 0.0),
                         "method": getattr(r, "compression_method", None)} for r in m.itertuples()}
    speed = {r.workload: (r.speedup, r.speedup_lo, r.speedup_hi, r.prompts) for r in m.itertuples()}
    beside = "in this page's main run, over prompts (BCa; shown, not deciding): " + "; ".join(
        f"{w} {v:.3g} [{lo:.3g}, {hi:.3g}]" for w, (v, lo, hi, _) in speed.items())
    speed_cond = "; ".join(p for p in (conditions, runs_note, beside if speed_runs else "") if p)
    parts = [
        judge_checks("C3", "greedy output token-identical to AR (all methods, all prompts)", exact,
                     "lossless: \"without losing coherence\"", conditions, chapter,
                     n=int(s.groupby("method")["prompts"].sum().min()) if len(s) else 0, unit="prompts"),
        judge_at_least("C3", f"new tokens per target forward, {method}", comp, 1.1,
                       "several tokens per forward pass (> 1; bar 1.1)", conditions_c, chapter,
                       confidence=confidence, tried=tried),
        judge_at_least("C3", f"wall-clock speedup over AR, {method}", speed_runs or speed, 1.0,
                       "faster than AR (paper: 1.5-2.3x)", "; ".join(x for x in (speed_cond, family) if x), chapter,
                       unit="whole runs", confidence=confidence, tried=tried),
    ]
    return decide_parts("C3", f"parallel decoding, lossless and faster ({method})", parts,
                        "lossless, several tokens per forward, faster than AR", conditions, chapter)


def performance_aim(summary: pd.DataFrame, method: str, workloads: Sequence[str] = ("humaneval", "xsum"),
                    target: float = 1.3) -> pd.DataFrame:
    """The study's performance target (lookahead >= 1.3x AR on code and summarisation), measured, not asserted.
    A workload with fewer than ``MIN_UNITS`` prompts is an illustration: no CI, and "met" is left empty."""
    from studylib.workbook.tables import why_not_measured

    s = summary[(summary.method == method) & summary.workload.isin(workloads)]
    out = s[["workload", "method", "prompts", "speedup", "speedup_lo", "speedup_hi"]].copy().reset_index(drop=True)
    out["target"] = target
    few = out.prompts.map(lambda n: ill.is_illustration(n))
    out["met"] = [None if f else bool(pd.notna(lo) and lo >= target) for f, lo in zip(few, out.speedup_lo, strict=True)]
    out.loc[few, ["speedup_lo", "speedup_hi"]] = np.nan
    return why_not_measured(out, met=ill.NOT_JUDGED) if few.any() else out
