"""Chapter 5, second half: how speculative decoding's gain interacts with batching (C8), and the peers.

Speculative decoding trades spare compute for fewer sequential steps. At batch 1 a decode step is
memory-bound, so verifying gamma+1 tokens costs about as much as one; as the batch grows the step
becomes compute-bound, verification costs more, and the gain shrinks (EAGLE-3 in SGLang: 1.81x at
batch 2, 1.38x at batch 64). We measure the runtime's step time for B sequences x k new tokens and
combine it with chapter 2's acceptance rate alpha:

    tokens per verify step  E = (1 - alpha^(gamma+1)) / (1 - alpha)
    speculative gain at B   S(B) = E * T(B, 1) / (T(B, gamma+1) + gamma * c * T(B, 1))
    batching gain at B      G(B) = B * T(1, 1) / T(B, 1)

with c the draft's cost per token relative to the target's (chapter 2's cost ratio when recorded).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from studylib.bench.provenance import other_machine
from studylib.claims import (
    as_point,
    load_chapter,
)
from studylib.decoding.common import Stopwatch
from studylib.kvcache import PagedBatch, PagedKVPool
from studylib.serving.workload import WorkloadItem, to_requests
from studylib.verdict import guard

CHAPTER = 5


@torch.inference_mode()
def step_curve(model, batches: Sequence[int], gamma: int, context: int = 128, repeats: int = 3) -> pd.DataFrame:
    """Median seconds of one forward over B sequences x k new tokens (k = 1 and gamma + 1) at ``context``
    cached tokens, through the same paged view the engine uses. The KV values are zeros: the step's
    cost does not depend on them."""
    rows = []
    dev = model.device
    for b in batches:
        for k in (1, gamma + 1):
            pool = PagedKVPool(model.config, block_size=16, num_blocks=b * -(-(context + k) // 16),
                               device=dev, dtype=model.dtype)
            tables = [pool.alloc(pool.blocks_for(context + k)) for _ in range(b)]
            ids = torch.randint(3, model.config.vocab_size, (1, b * k), device=dev)  # (1, B*k)
            times = []
            for r in range(repeats + 1):
                view = PagedBatch(pool, tables, [context] * b, [k] * b)
                clock = Stopwatch(dev)
                model(ids, view, logits=view.logit_index())
                if r:  # the first call warms this shape up
                    times.append(clock.elapsed())
            rows.append({"batch": b, "tokens_per_seq": k, "step_s": float(pd.Series(times).median())})
    return pd.DataFrame(rows)


def reports_folder(out_dir: str | Path) -> Path:
    """The profile's reports folder. ``studylib reproduce`` runs a chapter with ``out_dir`` set to
    ``<reports>/.staging/chNN`` (published on success), so the other chapters' files are two levels up."""
    out = Path(out_dir)
    return out.parent.parent if out.parent.name == ".staging" else out


def _find_alpha(node: Any, found: list[dict]) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("alpha"), int | float) and 0 < node["alpha"] < 1:
            found.append(node)
        for v in node.values():
            _find_alpha(v, found)
    elif isinstance(node, list):
        for v in node:
            _find_alpha(v, found)


def speculative_inputs(out_dir: str | Path, alpha: float, gamma: int, draft_cost: float) -> dict:
    """The drafter the batching model describes, from ``<out_dir>/ch02.json`` when chapter 2 measured it, else
    the given parameters (labelled). In order of preference:

    1. chapter 2's headline method (the drafter claim C3 is decided on, the shipped EAGLE head by default),
       with its measured tokens per target forward, its draft cost c and draft forwards per step, and its
       verify block (a tree verifies all its nodes at once): so chapter 5 models the same drafter chapter
       2 measured, not another;
    2. the distilled draft's acceptance and measured cost (a chain of ``gamma`` drafts);
    3. the parameters.

    Returns alpha, gamma, draft_cost, source, and the model's inputs ``tokens_per_step`` (None: from alpha
    and gamma), ``verify_tokens`` and ``draft_forwards``."""
    path = reports_folder(out_dir) / "ch02.json"
    out = {"alpha": alpha, "gamma": gamma, "draft_cost": draft_cost, "source": "the parameters (chapter 2 has not run)",
           "drafter": "a chain drafter from the parameters", "tokens_per_step": None, "verify_tokens": gamma + 1,
           "draft_forwards": gamma}
    if not path.is_file():
        return out
    found: list[dict] = []
    meas = load_chapter(path).get("measurements", {})
    head = meas.get("headline")
    row = next((r for r in meas.get("overall") or [] if isinstance(r, dict) and r.get("method") == head), None)
    tree = next((r for r in meas.get("eagle_trees") or [] if isinstance(r, dict) and r.get("method") == head), None)
    if row and tree and all(isinstance(tree.get(k), int | float) and tree[k] > 0
                            for k in ("c", "tau", "verify_tokens", "draft_forwards_per_step")):
        a = row.get("alpha")
        return {"alpha": float(a) if isinstance(a, int | float) else alpha, "gamma": int(tree.get("depth") or gamma),
                "draft_cost": float(tree["c"]), "drafter": str(head),
                "tokens_per_step": float(tree["tau"]), "verify_tokens": int(tree["verify_tokens"]),
                "draft_forwards": float(tree["draft_forwards_per_step"]),
                "source": f"chapter 2's run of its headline drafter {head} (tokens per target forward, draft cost c "
                          "and draft forwards per step as measured there)"}
    _find_alpha(meas.get("overall", []), found)  # chapter 2's per-method summary over all workloads
    if not found:
        _find_alpha(meas, found)
    # Only the draft-model rows of the distilled draft: self-speculation (alpha ~0.9) and prompt lookup
    # are other methods, and a median across them would describe no method at all.
    spec = [d for d in found if str(d.get("method", d.get("spec", ""))).lower().startswith("sps:distilled@")]
    if not spec:
        out["source"] = "the parameters (chapter 2 measured neither its headline drafter nor the distilled draft)"
        return out
    out["alpha"] = float(pd.Series([d["alpha"] for d in spec]).median())
    out["drafter"] = "the distilled draft"
    # chapter 2 records the draft's measured cost per forward relative to the target as ``measured_c``
    # in its draft table (``cost_ratio`` in older files)
    costs = [d[k] for d in meas.get("draft_table", []) if isinstance(d, dict) and d.get("draft") == "distilled"
             for k in ("measured_c", "cost_ratio") if isinstance(d.get(k), int | float) and d[k] > 0]
    if costs:
        out["draft_cost"] = float(costs[0])
        out["source"] = (f"chapter 2's run (the acceptance of {', '.join(str(d.get('method')) for d in spec)}; "
                         "the distilled draft's measured cost)")
    else:
        out["source"] = (f"chapter 2's run (the acceptance of {', '.join(str(d.get('method')) for d in spec)}); "
                         "the draft cost from the parameters, as chapter 2 measured none")
    return out


def speculative_inputs_text(spec: Mapping[str, Any]) -> str:
    """One sentence on what the batching model is fed, formatted from ``speculative_inputs``."""
    if spec.get("tokens_per_step") is not None:
        tokens = f"{spec['tokens_per_step']:.2f} tokens per target forward (measured)"
    else:
        tokens = (f"acceptance {spec['alpha']:.2f} with {spec['gamma']} drafts, so "
                  f"{expected_tokens(spec['alpha'], spec['gamma']):.2f} tokens per target forward (modelled)")
    forwards = spec.get("draft_forwards", spec["gamma"])
    return (f"The model describes {spec.get('drafter', 'a chain drafter')}: {tokens}; a draft forward costs "
            f"c = {spec['draft_cost']:.2f} target steps, {forwards:.3g} of them per step, and the verify step scores "
            f"{spec.get('verify_tokens', spec['gamma'] + 1)} tokens per sequence. Source: {spec['source']}.")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens committed per verification with i.i.d. acceptance ``alpha`` and ``gamma`` drafts."""
    return (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else gamma + 1.0


def c8_table(curve: pd.DataFrame, alpha: float, gamma: int, draft_cost: float, tokens_per_step: float | None = None,
             verify_tokens: int | None = None, draft_forwards: float | None = None) -> pd.DataFrame:
    """Per batch size: the batching gain G(B) and the speculative gain S(B) (module docstring). A chain of
    ``gamma`` drafts by default; a tree drafter passes its measured ``tokens_per_step``, the tokens its
    verify step scores (``verify_tokens``; ``curve`` must hold that step) and its ``draft_forwards``."""
    verify_tokens = gamma + 1 if verify_tokens is None else int(verify_tokens)
    draft_forwards = gamma if draft_forwards is None else draft_forwards
    t1 = curve[curve["tokens_per_seq"] == 1].set_index("batch")["step_s"]
    tv = curve[curve["tokens_per_seq"] == verify_tokens].set_index("batch")["step_s"]
    e = expected_tokens(alpha, gamma) if tokens_per_step is None else tokens_per_step
    rows = []
    for b in t1.index:
        rows.append({"batch": int(b), "step_ms": t1[b] * 1e3, "verify_ms": tv[b] * 1e3,
                     "verify_over_step": tv[b] / t1[b], "batching_gain": b * t1[t1.index.min()] / t1[b],
                     "speculative_gain": e * t1[b] / (tv[b] + draft_forwards * draft_cost * t1[b])})
    return pd.DataFrame(rows)


def ch01_curve(out_dir: str | Path) -> pd.DataFrame | None:
    """Chapter 1's decode step time vs. batch (``batch_scaling``), for a cross-check, if recorded."""
    path = reports_folder(out_dir) / "ch01.json"
    if not path.is_file():
        return None
    rows = load_chapter(path).get("measurements", {}).get("batch_scaling")
    if not rows:
        return None
    df = pd.DataFrame(rows)
    return df[[c for c in ("batch", "step_ms", "time_vs_batch1", "tokens_vs_batch1") if c in df]]


# "Not TPOT" is an equivalence test: the TPOT gain's CI must lie inside [1 - delta, 1 + delta]. The
# band's half-width is the study's choice (declared with C8@5 in notebooks/params/decisions.yaml), and it
# must be wider than what the instrument can resolve between cold runs, or the check could never hold: five
# whole runs that agree exactly still carry chapter 5's declared drift, a CI of at least exp(t x sd) - 1
# at C8's family level (``band_floor``: 0.116 at 97.5% with 0.04 on 8 df; 0.089 and 0.18 under earlier
# declarations). +-0.25 leaves room
# for the runs' own spread and still separates "TPOT unchanged" from the 1.8x the cache gives where it
# helps decoding too. One band for the study: chapter 7 shows its in-process prefix reading against the
# same band (it decides nothing there), so "TPOT unchanged" means one thing on every page.
EQUIVALENCE_DELTA = 0.25


def band_floor(confidence: float) -> float:
    """The half-width (as a ratio's distance from 1) of the narrowest CI five identical whole runs of a gain
    can have at ``confidence``: the declared between-session drift alone. A band narrower cannot hold."""
    import math

    from scipy import stats

    from studylib.bench.session_drift import df_between, sd_between

    # chapter 5's gains, the arm-against-arm kind (the gains' metric keys are "gain:...")
    sd, df = sd_between("gain", 5), df_between("gain", 5)
    return math.exp(stats.t.ppf(1 - (1 - confidence) / 2, df) * sd) - 1


TTFT_NOT_TPOT = "prefix cache helps TTFT, not TPOT"


def band_state(low: float, high: float, lo_bound: float, hi_bound: float, mc_error: float = 0.0) -> str:
    """Where the CI [low, high] lies against the band [lo_bound, hi_bound]: "inside", "outside" (wholly
    out of it) or "straddles" (across an edge): the three outcomes of an equivalence reading. A bound
    within ``verdict.GUARD_ERRORS`` of its own errors (``mc_error``: Monte Carlo or run-to-run) of an edge
    touches it, as the verdict rules read a bound near a bar: it is neither inside nor outside."""
    e = guard(mc_error)
    if lo_bound + e <= low and high <= hi_bound - e:
        return "inside"
    if high < lo_bound - e or low > hi_bound + e:
        return "outside"
    return "straddles"
TPOT_TOO = "prefix cache also shortens TPOT"


def ttft_not_tpot(ttft: Any, tpot: Any, delta: float = EQUIVALENCE_DELTA) -> dict[str, dict[str, bool]]:
    """The named checks of the two readings of what a prefix cache does, from the CIs of its TTFT and
    TPOT gains (baseline / cached, > 1 is faster), each an ``Estimate`` or a (value, low, high[, n]):

    - ``not_tpot`` ("helps TTFT, not TPOT"): the TTFT gain's CI lies at or above 1 + delta AND the
      TPOT gain's CI lies wholly inside [1 - delta, 1 + delta] (an equivalence test: "no effect on
      TPOT" must be shown, not read off a missing difference);
    - ``tpot_too`` ("also shortens TPOT"): the TPOT gain's CI lies above 1 + delta (the cache shortens
      decoding too: an interaction, e.g. with batching, where prefills share forward passes with decodes).

    A missing CI passes no check."""
    t, p = as_point(ttft), as_point(tpot)
    lo_t = t.ci[0] if t.ci else math.nan
    lo_p, hi_p = p.ci if p.ci else (math.nan, math.nan)
    band = f"[{1 - delta:.2f}, {1 + delta:.2f}]"
    return {"not_tpot": {f"TTFT gain CI >= {1 + delta:.2f}": bool(lo_t >= 1 + delta),
                         f"TPOT gain CI inside {band}": bool(1 - delta <= lo_p and hi_p <= 1 + delta)},
            "tpot_too": {f"TPOT gain CI > {1 + delta:.2f}": bool(lo_p > 1 + delta)}}


def prefix_effect(curve: pd.DataFrame, scheduler: str = "continuous") -> dict | None:
    """p50 TTFT and TPOT of ``scheduler`` without / with the radix cache, at saturation."""
    sat = curve[curve["rate"] == float("inf")].set_index("arm")
    a, b = scheduler, f"{scheduler}+radix"
    if not {a, b} <= set(sat.index):
        return None
    return {"ttft_gain": sat.loc[a, "ttft_p50_s"] / sat.loc[b, "ttft_p50_s"],
            "tpot_gain": sat.loc[a, "tpot_p50_s"] / sat.loc[b, "tpot_p50_s"],
            "hit_rate": sat.loc[b, "prefix_hit_rate"]}


# ---- peers ----------------------------------------------------------------------------------------

def hf_static_peer(model_name: str, tokenizer, items: Sequence[WorkloadItem], batch_size: int,
                   device: str = "cpu", dtype: str | None = None) -> dict:
    """HF transformers ``generate`` with left padding, fixed batches run to completion (static batching),
    greedy, on the same requests. Counts each request's tokens up to its own budget or EOS."""
    from studylib.models import load_hf_model

    hf = load_hf_model(model_name, device, dtype)
    reqs = to_requests(list(items), tokenizer)
    eos = {tokenizer.eos_token_id} if getattr(tokenizer, "eos_token_id", None) is not None else set()
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else (min(eos) if eos else 0)
    useful, start = 0, time.perf_counter()
    for i in range(0, len(reqs), batch_size):
        batch = reqs[i : i + batch_size]
        L = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((len(batch), L), pad, dtype=torch.long)
        mask = torch.zeros(len(batch), L, dtype=torch.long)
        for b, r in enumerate(batch):
            ids[b, L - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[b, L - len(r.prompt_ids):] = 1
        with torch.inference_mode():
            out = hf.generate(input_ids=ids.to(hf.device), attention_mask=mask.to(hf.device), do_sample=False,
                              max_new_tokens=max(r.max_new_tokens for r in batch), pad_token_id=pad)
        for b, r in enumerate(batch):
            toks = out[b, L : L + r.max_new_tokens].tolist()
            cut = next((j + 1 for j, t in enumerate(toks) if t in eos), len(toks))
            useful += cut
    dur = time.perf_counter() - start
    return {"peer": "HF transformers generate (static, padded)", "batch_size": batch_size, "requests": len(reqs),
            "output_tokens": useful, "duration_s": dur, "throughput_tok_s": useful / dur}


def _vllm_file(out_dir: str | Path) -> dict | None:
    path = reports_folder(out_dir) / "peers" / "vllm_cpu.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def vllm_peer(out_dir: str | Path) -> dict | None:
    """The vLLM CPU peer's summary (``benchmarks/peers/vllm_cpu.py --out <out_dir>/peers/vllm_cpu.json``),
    or None when absent or measured on another machine (``vllm_status`` says which)."""
    peer = _vllm_file(out_dir)
    return None if peer is None or other_machine(peer) else peer


def export_requests(items: Sequence[WorkloadItem], tokenizer, path: str | Path) -> Path:
    """Write the chapter's requests as token ids (JSONL: id, prompt_token_ids, max_new_tokens), so a peer
    in another virtual environment (``benchmarks/peers/vllm_cpu.py``) serves exactly the same work."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": r.id, "prompt_token_ids": r.prompt_ids, "max_new_tokens": r.max_new_tokens})
             for r in to_requests(list(items), tokenizer)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def explain_c8(c8: pd.DataFrame, gamma: int, verify_tokens: int | None = None) -> str:
    """One sentence reading the C8 table (true whatever the numbers are). ``verify_tokens``: the tokens the
    drafter's verify step scores (a tree's block; a chain of ``gamma`` drafts scores gamma + 1)."""
    a, b = c8.iloc[0], c8.iloc[-1]
    trend = "shrinks" if b.speculative_gain < a.speculative_gain else "does not shrink"
    block = gamma + 1 if verify_tokens is None else int(verify_tokens)
    return (f"Verifying {block} tokens per sequence costs {a.verify_over_step:.2f}x a plain decode step at batch "
            f"{int(a.batch)} and {b.verify_over_step:.2f}x at batch {int(b.batch)}; the modelled speculative gain "
            f"goes from {a.speculative_gain:.2f}x to {b.speculative_gain:.2f}x ({trend} over this range), while "
            f"batching alone gives {b.batching_gain:.2f}x the batch-{int(a.batch)} throughput at batch {int(b.batch)}.")


def vllm_status(vllm: dict | None, out_dir: str | Path) -> str:
    """A sentence saying whether the vLLM peer ran on these requests, and how to run it if not."""
    if vllm is None:
        peer = _vllm_file(out_dir)
        elsewhere = other_machine(peer) if peer is not None else None
        if elsewhere:
            return (f"vLLM CPU: not compared, because {elsewhere}; a side-by-side needs both on one "
                    "machine. Rerun the peer here on the requests exported below (the README's Peers section says how).")
        return ("vLLM CPU: not measured here (no vLLM run has left its results beside this chapter's). It runs from "
                "its own virtual environment on the requests exported below; the README's Peers section says how.")
    n = vllm.get("requests")
    return (f"vLLM CPU {vllm.get('vllm_version', '')}: read from the peer's results beside this chapter's, {n} requests served "
            f"{'with' if vllm.get('prefix_caching') else 'without'} prefix caching.")


def peer_rates_table(ours: pd.DataFrame, vllm: dict | None) -> pd.DataFrame:
    """Our continuous+radix engine and vLLM CPU at the same seeded Poisson rates on the same requests:
    throughput, p99 TTFT, p99 TPOT and median end-to-end latency per (system, rate). ``ours`` holds the
    per-request rows of ``ch05_load.latency_under_load`` at each rate; vLLM's rows come from its JSON
    (``benchmarks/peers/vllm_cpu.py --rates``) when present."""
    rows = []
    for (arm, rate), g in ours.groupby(["arm", "rate"], sort=True):
        e, t, p = g["e2el_s"].dropna(), g["ttft_s"].dropna(), g["tpot_s"].dropna()
        ends = (g["e2el_s"] + g["arrival_s"]).dropna() if "arrival_s" in g else e
        rows.append({"system": f"studylib {arm}", "rate_req_s": rate, "requests": len(g),
                     "throughput_tok_s": float(g["output_tokens"].sum() / ends.max()) if len(ends) else None,
                     "ttft_p99_s": float(np.percentile(t, 99)) if len(t) else None,
                     "tpot_p99_s": float(np.percentile(p, 99)) if len(p) else None,
                     "e2el_p50_s": float(e.median()) if len(e) else None})
    for run in (vllm or {}).get("poisson", []):
        rows.append({"system": f"vLLM CPU {vllm.get('vllm_version', '')}".strip(), "rate_req_s": run["rate_req_s"],
                     "requests": run["requests"], "throughput_tok_s": run["throughput_tok_s"],
                     "ttft_p99_s": run["ttft_s"]["p99"], "tpot_p99_s": run["tpot_s"]["p99"],
                     "e2el_p50_s": run["e2el_s"]["p50"]})
    return pd.DataFrame(rows).sort_values(["rate_req_s", "system"], ignore_index=True) if rows else pd.DataFrame()
