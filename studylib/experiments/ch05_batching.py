"""Chapter 5 measurements: sequential vs. static vs. continuous batching under a rate sweep (C5).

Every number comes from ``studylib.serving.Engine`` running the real model with wall-clock arrivals.
The notebook calls: ``chapter_workload`` -> ``rate_sweep`` -> ``saturation_gains`` /
``max_sustainable_rate`` / ``utilisation`` -> ``judge_c5``. Speculative-vs-batching (C8) and the
peers live in ``ch05_interplay``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from studylib.bench.stats import ratio_estimate, rotated
from studylib.claims import Verdict, decide_parts, judge_at_least
from studylib.errors import StudylibError
from studylib.models import arithmetic
from studylib.progress import progress_bar
from studylib.serving import Engine, EngineConfig
from studylib.serving.check import ar_references, divergence
from studylib.serving.workload import WorkloadItem, dataset_workload, to_requests
from studylib.workbook.tables import why_not_measured

CHAPTER = 5
# (scheduler, prefix cache) arms; static cannot share KV blocks (dense padded cache), so it has one.
ARMS: tuple[tuple[str, str], ...] = (("sequential", "none"), ("sequential", "radix"), ("static", "none"),
                                     ("continuous", "none"), ("continuous", "radix"))

ANCHORS = [
    {"system": "Orca (iteration-level scheduling)", "result": "36.9x throughput vs. FasterTransformer at equal latency",
     "model": "GPT-3 175B", "hardware": "A100 cluster", "source": "Yu et al., OSDI 2022"},
    {"system": "vLLM (PagedAttention + continuous batching)", "result": "2-4x throughput vs. Orca / FasterTransformer "
     "at equal latency", "model": "OPT-13B..175B, LLaMA-13B", "hardware": "A100", "source": "Kwon et al., SOSP 2023"},
    {"system": "seed document (C7)", "result": "8-12x throughput", "model": "unspecified", "hardware": "unspecified",
     "source": "the source document (abstract, section 1.3)"},
    {"system": "EAGLE-3 in SGLang", "result": "speculative gain 1.81x at batch 2 -> 1.38x at batch 64",
     "model": "LLaMA-3.1-8B", "hardware": "H100", "source": "Li et al. 2025 (EAGLE-3)"},
]


# An arm may carry speculation into the batch: "+lookup:GAMMA,NGRAM" after its scheduler and cache, e.g.
# "continuous+radix+lookup:8,3" (each greedy request verifies up to GAMMA tokens copied from its own text
# inside the batched step; ``EngineConfig.speculate``). Chapter 7's forced stack is that arm.
LOOKUP = "lookup"


def arm_name(scheduler: str, prefix_cache: str, speculate: str | None = None) -> str:
    name = scheduler if prefix_cache == "none" else f"{scheduler}+{prefix_cache}"
    if speculate:
        name += f"+{LOOKUP}:{speculate.partition(':')[2]}"
    return name


def base_arm(name: str) -> str:
    """The arm ``name`` without its speculation: ``continuous+radix+lookup:8,3`` -> ``continuous+radix``."""
    sched, prefix, _ = parse_arm(name)
    return arm_name(sched, prefix)


def speculates(name: str) -> bool:
    return bool(parse_arm(name)[2])


def chapter_workload(tokenizer, n: int, max_new_tokens: int, min_new_tokens: int | None = None,
                     workload: str = "chat", seed: int = 0) -> list[WorkloadItem]:
    """The chapter's requests: ``n`` prompts of ``workload`` through the model's chat template, output
    budgets in [min_new_tokens, max_new_tokens] (the chat set has no reference answers to size them)."""
    return dataset_workload(workload, n, seed, max_new_tokens, tokenizer, min_new_tokens=min_new_tokens)


def workload_frame(items: Sequence[WorkloadItem], tokenizer) -> pd.DataFrame:
    reqs = to_requests(list(items), tokenizer)
    sizes = {"prompt (tokens)": [len(r.prompt_ids) for r in reqs],
             "output budget (tokens)": [r.max_new_tokens for r in reqs]}
    return pd.DataFrame([{"": name, "mean": float(np.mean(v)), "min": int(np.min(v)), "median": float(np.median(v)),
                          "max": int(np.max(v))} for name, v in sizes.items()])


def _row(arm: str, scheduler: str, prefix: str, rate: float, repeat: int, summary: Mapping, run) -> dict:
    tl = pd.DataFrame(run.timeline)
    row = {"arm": arm, "scheduler": scheduler, "prefix_cache": prefix, "rate": rate, "repeat": repeat,
           "throughput_tok_s": summary["throughput_tok_s"], "requests_per_s": summary["requests_per_s"],
           "completed": summary["requests"], "duration_s": summary["duration_s"],
           "prefix_hit_rate": summary["prefix_hit_rate"], "preemptions": summary["preemptions"],
           "goodput_req_s": summary["goodput_req_s"],
           "mean_batch": float(tl["batch_seqs"].mean()) if len(tl) else 0.0,
           "peak_kv_used": float(tl["kv_used"].max()) if len(tl) else 0.0}
    for key in ("ttft_s", "tpot_s", "itl_s", "e2el_s"):
        for stat in ("p50", "p99"):
            row[f"{key[:-2]}_{stat}_s"] = summary[key][stat]
    # one request at a time, each request's TTFT from when its own service began: the idle server's TTFT
    idle = unqueued_ttfts(run.requests) if scheduler == "sequential" else []
    row["idle_ttft_p50_s"] = float(np.median(idle)) if idle else math.nan
    return row


def unqueued_ttfts(requests: Sequence) -> list[float]:
    """Serving one request at a time, each request's time to first token counted from when its service
    began (the previous request's finish, or its own arrival if later) rather than from its arrival: the
    TTFT an idle server gives, with the queue taken out. Valid only for one-at-a-time serving, where a
    request's service starts exactly when the one before it finishes."""
    served = sorted((r for r in requests if r.token_times and r.finished_s is not None),
                    key=lambda r: r.token_times[0])
    out, previous_finish = [], -math.inf
    for r in served:
        start = max(r.arrival_s, previous_finish)
        out.append(r.token_times[0] - start)
        previous_finish = r.finished_s
    return out


def serve(model, tokenizer, items: Sequence[WorkloadItem], scheduler: str, prefix_cache: str, rate: float,
          seed: int = 0, engine: Mapping | None = None, speculate: str | None = None):
    """One run of one arm at one rate on fresh copies of ``items``; returns (requests, ServingRun).
    ``speculate``: the arm's in-batch prompt lookup (``prompt-lookup:GAMMA,NGRAM``), or None."""
    reqs = to_requests(list(items), tokenizer, rate=rate, seed=seed)
    config = EngineConfig(scheduler=scheduler, prefix_cache=prefix_cache,
                          **{**dict(engine or {}), **({"speculate": speculate} if speculate else {})})
    return reqs, Engine(model, config, tokenizer).run(reqs)


def rate_sweep(model, tokenizer, items: Sequence[WorkloadItem], rates: Iterable[float],
               arms: Sequence[tuple[str, str]] = ARMS, slo: Mapping | None = None, repeats_at_saturation: int = 1,
               seed: int = 0, engine: Mapping | None = None) -> tuple[pd.DataFrame, dict, dict]:
    """Every arm at every rate (``inf`` = all requests at t=0, i.e. saturation, run
    ``repeats_at_saturation`` times). Returns (one row per run, timelines by (arm, rate), outputs by arm
    at saturation for the equality check)."""
    rates = sorted(set(float(r) for r in rates))
    arms = list(arms)
    # Arms interleaved: each repeat (one unit of the saturation CI) runs every arm back to back, in an
    # order that rotates per repeat, so drift in machine load falls on all arms alike.
    plan = []
    for r in rates:
        for k in range(repeats_at_saturation if math.isinf(r) else 1):
            plan += [(s, p, r, k) for s, p in rotated(arms, k + len(plan))]
    rows, timelines, outputs = [], {}, {}
    for sched, prefix, rate, k in progress_bar(plan, desc="ch05 sweep", leave=False):
        arm = arm_name(sched, prefix)
        reqs, run = serve(model, tokenizer, items, sched, prefix, rate, seed, engine)
        rows.append(_row(arm, sched, prefix, rate, k, run.summary(slo), run))
        if k == 0:
            timelines[(arm, rate)] = pd.DataFrame(run.timeline)
            if math.isinf(rate):
                outputs[arm] = [r.output_ids for r in reqs]
    return pd.DataFrame(rows), timelines, outputs


def parse_arm(name: str) -> tuple[str, str, str | None]:
    """``continuous+radix`` -> ("continuous", "radix", None); ``static`` -> ("static", "none", None);
    ``continuous+radix+lookup:8,3`` -> ("continuous", "radix", "prompt-lookup:8,3")."""
    sched, *rest = name.split("+")
    prefix = "radix" if rest[:1] == ["radix"] else "none"
    rest = rest[1:] if prefix == "radix" else rest
    speculate = None
    if rest and rest[0].startswith(f"{LOOKUP}:"):
        gamma, _, ngram = rest[0].partition(":")[2].partition(",")
        if not (gamma.isdigit() and ngram.isdigit() and int(gamma) >= 1 and int(ngram) >= 1):
            raise StudylibError(f"arm {name!r}: give the lookup as lookup:GAMMA,NGRAM with both >= 1 "
                                "(e.g. continuous+radix+lookup:8,3).")
        speculate, rest = f"prompt-{LOOKUP}:{int(gamma)},{int(ngram)}", rest[1:]
    if sched not in ("sequential", "static", "continuous") or rest:
        raise StudylibError(f"unknown arm {name!r}; use sequential, static or continuous, optionally +radix, then "
                            "optionally +lookup:GAMMA,NGRAM (static cannot share KV blocks or speculate).")
    if sched == "static" and (prefix != "none" or speculate):
        raise StudylibError(f"{name} is not an arm: static batching's dense padded cache cannot share KV blocks "
                            "or roll back a draft; use sequential or continuous.")
    return sched, prefix, speculate


def saturation_runs(model, tokenizer, items: Sequence[WorkloadItem], arms: Sequence[str], repeats: int,
                    seed: int = 0, engine: Mapping | None = None, slo: Mapping | None = None,
                    split_sequential: bool = True) -> tuple[pd.DataFrame, dict, dict]:
    """Every arm with all ``items`` queued at t = 0 (saturation), ``repeats`` times, arms interleaved in
    an order that rotates per repeat (one repeat = one unit of the throughput CIs).

    ``split_sequential``: the one-at-a-time arms serve a different ``1/repeats`` share of the requests
    in each repeat (request i in repeat i mod repeats), so that over the repeats they serve every request
    exactly once. One request at a time, requests do not interact: the share's tokens over its time is
    that arm's throughput, and the whole set costs one pass instead of ``repeats`` (on a CPU that pass
    is most of the chapter's time). Its per-repeat throughput then also varies with the share's mix,
    which widens, never narrows, the CI of every gain over it.

    Returns (one row per run, the first repeat's timeline per arm, {arm: {request id: greedy tokens}})."""
    arms = [parse_arm(a) for a in arms]
    rows, timelines, outputs = [], {}, {}
    # One untimed pass of each arm on a few short requests first: the first run of a code path pays
    # one-off costs (packing weights for the kernels, allocator growth) that belong to no arm.
    warm = [WorkloadItem(i.id, min(2, i.max_new_tokens), i.prompt, i.messages, i.prompt_ids) for i in items[:4]]
    for sched, prefix, spec in arms:
        serve(model, tokenizer, warm, sched, prefix, math.inf, seed, engine, spec)
    plan = [(*a, k) for k in range(repeats) for a in rotated(arms, k)]
    for sched, prefix, spec, k in progress_bar(plan, desc="ch05 saturation", leave=False):
        arm = arm_name(sched, prefix, spec)
        share = list(items[k::repeats]) if split_sequential and sched == "sequential" else list(items)
        if not share:
            continue
        reqs, run = serve(model, tokenizer, share, sched, prefix, math.inf, seed, engine, spec)
        row = _row(arm, sched, prefix, math.inf, k, run.summary(slo), run)
        row["requests"] = len(share)
        rows.append(row)
        if k == 0:
            timelines[(arm, math.inf)] = pd.DataFrame(run.timeline)
        outputs.setdefault(arm, {}).update({r.id: list(r.output_ids) for r in reqs})
    return pd.DataFrame(rows), timelines, outputs


def _saturation_median(runs: pd.DataFrame, arm: str, column: str, what: str) -> float:
    """Median of ``column`` over ``arm``'s saturation runs (rate = inf); a missing arm or column names ``what``."""
    sat = runs[np.isinf(runs["rate"]) & (runs["arm"] == arm)]
    if not len(sat) or column not in sat or sat[column].isna().all():
        raise StudylibError(f"no saturation run of {arm!r} to measure {what} from.")
    return float(sat[column].median())


def single_request_tpot(runs: pd.DataFrame, arm: str = "sequential") -> float:
    """Median TPOT of one-at-a-time serving at saturation: the machine's single-request decode speed."""
    return _saturation_median(runs, arm, "tpot_p50_s", "single-request TPOT")


def single_request_ttft(runs: pd.DataFrame, arm: str = "sequential") -> float:
    """Median TTFT of one-at-a-time serving at saturation with the queue taken out (``unqueued_ttfts``): the
    machine's single-request prefill, no prefix cache."""
    return _saturation_median(runs, arm, "idle_ttft_p50_s", "single-request TTFT")


def scaled_slo(runs: pd.DataFrame, tpot_factor: float) -> dict:
    """The SLO, scaled to this model and machine by one tolerance: p99 TPOT <= ``tpot_factor`` x this
    machine's single-request TPOT and p99 TTFT <= the same factor x its single-request TTFT (both from
    one-at-a-time serving, the TTFT with the queue taken out): a user tolerates that much slowdown from load.

    An earlier rule set TTFT at MLPerf's interactive ratio (450 ms : 40 ms) to the TPOT limit. That ratio
    assumes a prefill worth ~11 decode steps; on this CPU a 200-token prefill costs about as much as the
    whole limit, so the limit sat at the idle server's own p99 and no rate met it (the runs of bb36cad and
    3588743 missed it by 2% at 0.16x continuous+radix's saturation rate)."""
    tpot = tpot_factor * single_request_tpot(runs)
    ttft = tpot_factor * single_request_ttft(runs)
    return {"ttft_s": round(ttft, 4), "tpot_s": round(tpot, 4)}


def request_rate(runs: pd.DataFrame, arm: str) -> float:
    """Median completed requests per second of ``arm`` at saturation: its service rate."""
    return _saturation_median(runs, arm, "requests_per_s", "its service rate")


def relative_rates(saturation: pd.DataFrame, multiples: Iterable[float], base_arm: str = "sequential") -> list[float]:
    """Arrival rates as multiples of ``base_arm``'s request throughput at saturation (its capacity), so
    "light" and "overload" mean the same on any machine: 0.5 is light for every policy, 1 saturates
    sequential serving, larger multiples overload the weaker policies."""
    cap = request_rate(saturation, base_arm)
    return [round(m * cap, 4) for m in multiples]


def peer_table(curve: pd.DataFrame, hf: Mapping | None, vllm: Mapping | None) -> pd.DataFrame:
    """Saturation throughput of our arms beside the peers run on the same requests and machine."""
    sat = curve[np.isinf(curve["rate"])]
    rows = [{"system": f"studylib {r.arm}", "throughput_tok_s": r.throughput_tok_s, "tpot_p99_s": r.tpot_p99_s}
            for r in sat.itertuples()]
    if hf:
        rows.append({"system": hf["peer"], "throughput_tok_s": hf["throughput_tok_s"], "tpot_p99_s": None})
    if vllm:
        rows.append({"system": f"vLLM CPU {vllm.get('vllm_version', '')}".strip(),
                     "throughput_tok_s": vllm.get("throughput_tok_s"), "tpot_p99_s": vllm.get("tpot_p99_s")})
    why = ("HF generate returns whole batches, so the time of each output token is not observed; a peer that "
           "records no per-token timings leaves it empty too")
    return why_not_measured(pd.DataFrame(rows), tpot_p99_s=why)


def curves(df: pd.DataFrame) -> pd.DataFrame:
    """Median over repeats per (arm, rate): the throughput-latency curve points."""
    cols = ["throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2el_p99_s",
            "prefix_hit_rate", "mean_batch", "peak_kv_used", "completed", "preemptions"]
    out = df.groupby(["arm", "rate"], sort=False)[cols].median().reset_index()
    out["load"] = out["rate"].map(lambda r: "saturation" if math.isinf(r) else f"{r:.3g} req/s")
    return out


def saturation_gains(df: pd.DataFrame, treated: str = "continuous+radix") -> pd.DataFrame:
    """Throughput of ``treated`` and ``continuous`` over each other arm at saturation (paired by repeat)."""
    sat = df[np.isinf(df["rate"])]
    rows = []
    for num in dict.fromkeys([treated, "continuous"]):
        t = sat[sat["arm"] == num].sort_values("repeat")["throughput_tok_s"].to_numpy()
        for base in sat["arm"].unique():
            if base == num or len(t) == 0:
                continue
            b = sat[sat["arm"] == base].sort_values("repeat")["throughput_tok_s"].to_numpy()
            n = min(len(b), len(t))
            est = ratio_estimate(1 / b[:n], 1 / t[:n])  # = median(t) / median(b): a throughput gain
            rows.append({"treated": num, "baseline": base, "gain": est.value, "ci_low": est.ci_low,
                         "ci_high": est.ci_high, "repeats": n, "estimate": est})
    return pd.DataFrame(rows)


def max_sustainable_rate(curve: pd.DataFrame, slo: Mapping[str, float]) -> pd.DataFrame:
    """Per arm: the highest swept rate whose p99 TTFT and p99 TPOT meet the SLO (None if no rate does).
    Saturation counts as a rate only if even it meets the SLO (reported as inf)."""
    rows = []
    for arm, g in curve.groupby("arm", sort=False):
        ok = g[(g["ttft_p99_s"] <= slo.get("ttft_s", math.inf)) & (g["tpot_p99_s"].fillna(0) <= slo.get("tpot_s", math.inf))]
        best = float(ok["rate"].max()) if len(ok) else None
        rows.append({"arm": arm, "max_rate_req_s": best,
                     "throughput_there_tok_s": float(ok.loc[ok["rate"].idxmax(), "throughput_tok_s"]) if len(ok) else None})
    return pd.DataFrame(rows)


def utilisation(timelines: Mapping, rate: float) -> pd.DataFrame:
    """Long-format time series (t, arm, metric, value) of the runs at ``rate`` for plotting."""
    frames = []
    for (arm, r), tl in timelines.items():
        if r == rate and len(tl):
            d = tl[["t", "batch_seqs", "waiting", "kv_used"]].copy()
            d["arm"] = arm
            frames.append(d.melt(id_vars=["t", "arm"], var_name="metric", value_name="value"))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["t", "arm", "metric", "value"])


def equality(model, tokenizer, items: Sequence[WorkloadItem], outputs: Mapping[str, Mapping | list], n: int,
             invariant: bool | None = None) -> pd.DataFrame:
    """Greedy outputs of the first ``n`` requests under each arm vs. the single-request AR decoder.
    ``outputs[arm]`` maps request id -> tokens (or is a list aligned with ``items``); requests an arm did
    not serve are skipped. ``invariant`` (default: as the engine resolves it for this model) runs the
    reference under the same batch-invariant kernels the engine used."""
    from studylib.serving.invariant import kernels_apply

    if invariant is None:
        invariant = kernels_apply(model.device) and model.dtype == torch.float32
    reqs = to_requests(list(items[:n]), tokenizer)
    refs = dict(zip([r.id for r in reqs], ar_references(model, reqs, tokenizer, invariant=invariant), strict=True))
    rows = []
    for arm, outs in outputs.items():
        by_id = outs if isinstance(outs, Mapping) else {it.id: o for it, o in zip(items, outs, strict=False)}
        ids = [r.id for r in reqs if r.id in by_id]
        d = divergence([by_id[i] for i in ids], [refs[i] for i in ids])
        rows.append({"arm": arm, "requests": d["requests"], "identical": d["identical"],
                     "divergence_rate": d["divergence_rate"], "first_divergence": d["first_divergence"]})
    return pd.DataFrame(rows)


def _gain(gains: pd.DataFrame, treated: str, baseline: str):
    g = gains[(gains["treated"] == treated) & (gains["baseline"] == baseline)]
    return g["estimate"].iloc[0] if len(g) else None


def judge_c5(gains: pd.DataFrame, curve: pd.DataFrame, conditions: str) -> list[Verdict]:
    """C5, one decision over two parts that must both hold: continuous batching serves more throughput at
    saturation than sequential serving (no fragmentation into batches of one) AND than static batching
    (no idle waits for the batch to drain, no padding); each a gain > 1 with a CI over >= 5 interleaved
    whole-run repeats. The p99 latencies at finite rates are reported beside it, not judged (a p99 over
    one run's few requests is not an estimate)."""
    parts = []
    for base, why in (("sequential", "no fragmentation into batches of one"),
                      ("static", "no idle waits for a static batch to drain")):
        est = _gain(gains, "continuous", base)
        parts.append(judge_at_least("C5", f"throughput of continuous batching / {base} at saturation (x)",
                                    est if est is not None else float("nan"), 1.0, why, conditions, CHAPTER,
                                    unit="whole runs"))
    return decide_parts("C5", "continuous batching beats sequential and static serving", parts,
                        "dynamic batching avoids static batching's idle waits and small batches' fragmentation",
                        conditions, CHAPTER)


def performance_aim(gains: pd.DataFrame, target: float = 8.0) -> pd.DataFrame:
    """The study's performance target: continuous + prefix cache >= ``target`` x sequential throughput at saturation."""
    rows = []
    for base in ("sequential", "sequential+radix", "static"):
        est = _gain(gains, "continuous+radix", base)
        if est is not None:
            rows.append({"aim": f"continuous+radix / {base} >= {target:g}x" if base == "sequential" else
                         f"continuous+radix / {base}", "measured": est.value, "ci_low": est.ci_low,
                         "ci_high": est.ci_high, "met": bool(est.value >= target) if base == "sequential" else None})
    return why_not_measured(pd.DataFrame(rows), met="the target is set against sequential serving only; the other "
                                                    "rows are shown for context")


def conditions_text(model, n: int, max_new_tokens: int, workload: str = "chat") -> str:
    c = model.config
    return (f"{c.name}{' (random weights)' if c.random_weights else ''}, {arithmetic(model)} "
            f"on {model.device.type}; {n} requests ({workload}), <= {max_new_tokens} new tokens each; greedy; "
            "saturation = all requests at t=0")


def explain_gains(gains: pd.DataFrame, curve: pd.DataFrame) -> str:
    """One sentence that reads the numbers (true whatever they are)."""
    vs = {r.baseline: r.gain for r in gains[gains["treated"] == "continuous"].itertuples()}
    sat = curve[np.isinf(curve["rate"])].set_index("arm")
    parts = [f"At saturation continuous batching delivers {vs.get('sequential', float('nan')):.2f}x the throughput "
             f"of sequential serving and {vs.get('static', float('nan')):.2f}x that of static batching"]
    if "continuous" in sat.index:
        parts.append(f"with a mean of {sat.loc['continuous', 'mean_batch']:.1f} sequences per forward pass")
    return "; ".join(parts) + ". The ceiling on this gain is how much cheaper one batched step is than the same " \
        "tokens run one at a time (the step-time curve below), which scheduling can approach but not exceed."


def c7_record(gains: pd.DataFrame, runs: pd.DataFrame, conditions: str, treated: str = "continuous+radix") -> dict:
    """What chapter 7 reads for C7's throughput row: each arm's saturation throughput gain over sequential
    serving, with its CI, n and how the CI was taken (``method``: over whole runs when ``gains`` comes from
    ``ch05_runs.gains_over_runs``; an arm it lacks falls back to this process's replays, which count no
    repeats)."""
    rows = []
    sat = runs[np.isinf(runs["rate"])]
    for arm in sat["arm"].unique():
        tput = float(sat[sat["arm"] == arm]["throughput_tok_s"].median())
        est = _gain(gains, arm, "sequential") if arm != "sequential" else None
        if arm != "sequential" and est is None:
            b = sat[sat["arm"] == "sequential"].sort_values("repeat")["throughput_tok_s"].to_numpy()
            t = sat[sat["arm"] == arm].sort_values("repeat")["throughput_tok_s"].to_numpy()
            n = min(len(b), len(t))
            est = ratio_estimate(1 / b[:n], 1 / t[:n]) if n else None
        rows.append({"arm": arm, "throughput_tok_s": tput,
                     "gain": 1.0 if arm == "sequential" else (est.value if est else None),
                     "ci": [1.0, 1.0] if arm == "sequential" else ([est.ci_low, est.ci_high] if est else None),
                     "repeats": int(est.n) if est is not None else int((sat["arm"] == arm).sum()),
                     "method": getattr(est, "method", None), "mc_error": getattr(est, "mc_error", 0.0)})
    return {"treated": treated, "baseline": "sequential", "conditions": conditions, "arms": rows}
