"""Chapter 5, serving at real load: capacity under an SLO, latency at a fixed rate, cache-aware
admission, KV fragmentation, and chunked prefill's effect on the running decodes.

Every number comes from ``studylib.serving.Engine`` running the real model with wall-clock arrivals
(seeded Poisson, so every arm of a comparison serves the same arrival times). The notebook calls:

- ``shared_prefix_workload``: chat requests behind a few long system prompts that arrive interleaved;
- ``capacity_search`` -> ``capacity_table``: the highest rate an arm serves within a p99 TTFT / TPOT SLO
  (the "capacity" of Sarathi-Serve and DistServe);
- ``latency_under_load`` -> ``e2e_ratio``: per-request end-to-end latency of several arms at one rate,
  and a paired ratio with a bootstrap CI over requests;
- ``cache_aware_comparison``: FCFS vs SGLang's longest-prefix-match admission with the starvation bound;
- ``fragmentation``: KV bytes reserved vs bytes live, static padded batching vs the paged pool;
- ``chunked_prefill_itl``: inter-token latency of running decodes while long prompts are prefilled, whole
  or in chunks.

An arm is ``(scheduler, prefix_cache)`` or ``(scheduler, prefix_cache, {extra EngineConfig options})``,
e.g. ``("continuous", "radix", {"cache_aware": True})``; ``engine`` is a mapping of EngineConfig options
passed to every run (an arm's own options win).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from studylib.bench.stats import Estimate, ratio_estimate
from studylib.errors import StudylibError
from studylib.experiments.ch05_batching import arm_name, request_rate
from studylib.progress import progress_bar
from studylib.serving import Engine, EngineConfig
from studylib.serving.metrics import check_slo
from studylib.serving.workload import WorkloadItem, dataset_workload, to_requests
from studylib.workbook.tables import why_not_measured

CHAPTER = 5


# ---- arms and runs ---------------------------------------------------------------------------------

def arm_label(arm: Sequence) -> str:
    """``continuous+radix``; with extra options, e.g. ``continuous+radix[cache_aware=True]``."""
    name = arm_name(arm[0], arm[1])
    extra = dict(arm[2]) if len(arm) > 2 else {}
    return name + (f"[{', '.join(f'{k}={v}' for k, v in extra.items())}]" if extra else "")


def _config(arm: Sequence, engine: Mapping | None) -> dict:
    if len(arm) not in (2, 3):
        raise StudylibError(f"an arm is (scheduler, prefix_cache) or (scheduler, prefix_cache, {{options}}), "
                            f"got {arm!r}.")
    return {**dict(engine or {}), **(dict(arm[2]) if len(arm) > 2 else {}),
            "scheduler": arm[0], "prefix_cache": arm[1]}


def _serve(model, tokenizer, items: Sequence[WorkloadItem], config: Mapping, rate: float, seed: int,
           ignore_eos: bool = False):
    """One real run of fresh copies of ``items`` at a seeded Poisson ``rate``; every request must be
    servable (a rejection is a configuration problem, not a measurement). Returns (requests, run)."""
    reqs = to_requests(list(items), tokenizer, rate=rate, seed=seed, ignore_eos=ignore_eos)
    run = Engine(model, EngineConfig(**config), tokenizer).run(reqs)
    rejected = [r for r in reqs if r.stop_reason == "rejected"]
    if rejected:
        raise StudylibError(f"{len(rejected)} of {len(reqs)} requests were rejected (first: {rejected[0].error}); "
                            "raise kv_budget_mib or drop the longest prompts.")
    return reqs, run


def _p(summary: Mapping, key: str, stat: str) -> float | None:
    return summary[key][stat]


def _kv_token_bytes(model) -> int:
    import torch

    return model.config.kv_bytes_per_token(torch.empty(0, dtype=model.dtype).element_size())


# ---- (a) the workload ------------------------------------------------------------------------------

def system_prompts(tokenizer, n_systems: int, system_tokens: int, seed: int = 0) -> list[str]:
    """``n_systems`` distinct system prompts of about ``system_tokens`` tokens each: a one-line
    instruction naming the assistant, then whole NarrativeQA stories (disjoint between prompts, in a
    seeded order), cut to ``system_tokens`` tokens. They differ from their first few tokens on, so
    the only sharing is within a system prompt."""
    from studylib.data import load_dataset

    if n_systems < 1 or system_tokens < 1:
        raise StudylibError(f"n_systems and system_tokens must be >= 1, got {n_systems} and {system_tokens}.")
    docs = sorted({r.meta["document"].strip() for r in load_dataset("narrativeqa")} - {""})
    random.Random(seed).shuffle(docs)
    if n_systems > len(docs):
        raise StudylibError(f"n_systems={n_systems} needs as many NarrativeQA stories; the set has {len(docs)}.")

    def ids(text: str) -> list[int]:
        return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]

    out = []
    for k in range(n_systems):
        text = (f"You are assistant number {k + 1} of a reading club. Answer the user's request; the stories "
                "below are background you may draw on.\n\n")
        for doc in docs[k::n_systems]:
            if len(ids(text)) >= system_tokens:
                break
            text += doc + "\n\n"
        cut = ids(text)
        if len(cut) < system_tokens:
            raise StudylibError(f"the stories give only {len(cut)} tokens per system prompt; lower system_tokens "
                                f"({system_tokens}) or n_systems ({n_systems}).")
        out.append(tokenizer.decode(cut[:system_tokens]).rstrip("\ufffd"))
    return out


def shared_prefix_workload(tokenizer, n: int, system_tokens: int = 1024, n_systems: int = 4, seed: int = 0,
                           max_new_tokens: int = 64, min_new_tokens: int | None = None) -> list[WorkloadItem]:
    """``n`` chat requests (``dataset_workload("chat")``), request i behind system prompt ``i % n_systems``
    (``system_prompts``): the shared prefixes arrive interleaved, A, B, C, A, B, C, ..., the order in
    which first-come-first-served admission makes the worst use of a small prefix cache and
    longest-prefix-match admission can regroup them. Messages carry a ``system`` role."""
    systems = system_prompts(tokenizer, n_systems, system_tokens, seed)
    chat = dataset_workload("chat", n, seed, max_new_tokens, tokenizer, min_new_tokens=min_new_tokens)
    items = []
    for i, item in enumerate(chat):
        k = i % n_systems
        turns = item.messages if item.messages is not None else [{"role": "user", "content": item.prompt}]
        turns = [m for m in turns if m["role"] != "system"]
        items.append(WorkloadItem(f"sys{k}-{item.id}", item.max_new_tokens,
                                  messages=[{"role": "system", "content": systems[k]}, *turns]))
    return items


# ---- (b) capacity under an SLO ---------------------------------------------------------------------

@dataclass
class Capacity:
    """One capacity search: ``capacity`` is the highest probed rate that met the SLO (None if even the
    lowest failed); ``bracket`` is (last rate met, first rate failed above it), None where unknown;
    ``probes`` has one row per real run."""

    arm: str
    capacity: float | None
    bracket: tuple[float | None, float | None]
    probes: pd.DataFrame
    slo: dict = field(default_factory=dict)

    @property
    def censored(self) -> bool:
        """True when even the highest rate met the SLO: the capacity is at least ``capacity``."""
        return self.capacity is not None and self.bracket[1] is None


def _probe_row(summary: Mapping, n: int) -> dict:
    return {"ttft_p99_s": _p(summary, "ttft_s", "p99"), "tpot_p99_s": _p(summary, "tpot_s", "p99"),
            "throughput_tok_s": summary["throughput_tok_s"], "requests_per_s": summary["requests_per_s"],
            "completed": summary["requests"], "requests": n}


def _missed(row: Mapping, slo: Mapping) -> list[str]:
    """What a probe missed: "completed" (a request did not finish), "ttft_s", "tpot_s" (its p99 over the
    limit, or no TTFT at all); empty when it met the SLO."""
    out = []
    if row.get("completed") is not None and row.get("requests") is not None and row["completed"] < row["requests"]:
        out.append("completed")
    ttft, tpot = row.get("ttft_p99_s"), row.get("tpot_p99_s")
    if "ttft_s" in slo and (ttft is None or ttft > slo["ttft_s"]):
        out.append("ttft_s")
    # One-token outputs have no TPOT: a run with none cannot violate a TPOT bound.
    if "tpot_s" in slo and tpot is not None and tpot > slo["tpot_s"]:
        out.append("tpot_s")
    return out


def _meets(row: Mapping, slo: Mapping) -> bool:
    return not _missed(row, slo)


def capacity_search(model, tokenizer, items: Sequence[WorkloadItem], arm: Sequence, slo: Mapping[str, float],
                    rate_lo: float, rate_hi: float, probes: int = 6, seed: int = 0, engine: Mapping | None = None,
                    *, rate_floor: float | None = None, run_probe: Callable[[float], Mapping] | None = None,
                    progress: bool | None = None) -> Capacity:
    """The arm's capacity: the highest Poisson arrival rate (requests/s) at which it keeps p99 TTFT <=
    ``slo["ttft_s"]`` and p99 TPOT <= ``slo["tpot_s"]`` with every request completed (the measure of
    Sarathi-Serve and DistServe: throughput alone hides latency, a latency at one rate hides how much
    load a system takes).

    Every probe is one real run of all ``items`` (pass 150 or more, so a p99 rests on a few requests) at a
    seeded Poisson rate; the same seed at every rate gives the same arrival pattern, rescaled in time.
    The search probes ``rate_lo``. If that fails, it steps down by the range's own factor
    (``rate_hi / rate_lo``) while probes remain and the rate stays >= ``rate_floor`` (default: one step
    below ``rate_lo``'s range, ``rate_lo`` squared over ``rate_hi``), until a rate meets the SLO; if none
    does, the capacity is None and is below the lowest rate probed. If ``rate_lo`` passes, it probes
    ``rate_hi`` (if that passes too: capacity >= rate_hi, ``censored``; widen the range). Then it bisects
    the bracket between the highest rate met and the lowest failed above it, in log-rate space, at most
    ``probes`` runs in all. The answer is known to within the final bracket, and p99s at a rate near the
    capacity are noisy: a probe just below it can fail by chance. ``run_probe(rate)`` replaces the real
    run (tests): it returns a mapping with ``ttft_p99_s``, ``tpot_p99_s``, ``throughput_tok_s`` and
    optionally ``completed`` / ``requests``."""
    slo = check_slo(slo)
    if not {"ttft_s", "tpot_s"} & set(slo):
        raise StudylibError("capacity_search needs an SLO on ttft_s and/or tpot_s (seconds).")
    if not 0 < rate_lo < rate_hi or math.isinf(rate_hi):
        raise StudylibError(f"need 0 < rate_lo < rate_hi < inf requests/s, got {rate_lo} and {rate_hi}.")
    if probes < 2:
        raise StudylibError(f"probes must be >= 2 (the two ends of the range), got {probes}.")
    step = float(rate_hi) / float(rate_lo)
    floor = float(rate_lo) / step if rate_floor is None else float(rate_floor)
    if not 0 < floor <= rate_lo:
        raise StudylibError(f"need 0 < rate_floor <= rate_lo, got rate_floor={rate_floor} and rate_lo={rate_lo}.")
    label = arm_label(arm)
    if run_probe is None:
        config = _config(arm, engine)

        def run_probe(rate: float) -> dict:
            _, run = _serve(model, tokenizer, items, config, rate, seed)
            return _probe_row(run.summary(), len(items))

    rows: list[dict] = []
    bar = progress_bar(total=probes, progress=progress, desc=f"capacity[{label}]", leave=False)

    def probe(rate: float) -> bool:
        row = {"arm": label, "probe": len(rows), "rate": float(rate), **dict(run_probe(rate))}
        row["met"] = _meets(row, slo)
        rows.append(row)
        bar.update(1)
        return row["met"]

    lo, hi = float(rate_lo), float(rate_hi)
    met: float | None = None  # the highest rate that met the SLO
    if probe(lo):
        met = lo
        if probe(hi):
            met, hi = hi, None
    else:
        # below the range: step down (one range's factor at a time) until a rate meets the SLO
        hi = lo
        while len(rows) < probes and hi / step >= floor * (1 - 1e-9):
            if probe(hi / step):
                met = hi / step
                break
            hi /= step
    if met is not None and hi is not None:
        lo = met
        while len(rows) < probes:
            mid = math.sqrt(lo * hi)
            if probe(mid):
                lo = mid
            else:
                hi = mid
        met = lo
    bar.close()
    return Capacity(label, met, (met, hi), pd.DataFrame(rows), slo)


def capacity_table(results: Sequence[Capacity] | Mapping[str, Capacity], baseline: str | None = None) -> pd.DataFrame:
    """One row per search: the capacity (req/s), its bracket, the throughput of the run at that rate, and
    the capacity over ``baseline``'s (an arm label; the first result by default).

    A capacity ratio here is one search per arm, a single measurement with no confidence interval: the
    bracket's width and the noise of a p99 near the capacity both move it. For a CI, repeat the searches
    (different seeds, arms interleaved) and pass the per-repeat ratios to ``studylib.bench.stats.estimate``."""
    results = list(results.values()) if isinstance(results, Mapping) else list(results)
    if not results:
        return pd.DataFrame()
    by_arm = {r.arm: r for r in results}
    baseline = baseline if baseline is not None else results[0].arm
    if baseline not in by_arm:
        raise StudylibError(f"baseline arm {baseline!r} is not among the searches ({sorted(by_arm)}).")
    base = by_arm[baseline].capacity
    rows = []
    for r in results:
        at = r.probes[(r.probes["rate"] == r.capacity) & r.probes["met"]] if r.capacity is not None else r.probes[:0]
        rows.append({
            "arm": r.arm, "capacity_req_s": r.capacity,
            "met_up_to": r.bracket[0], "failed_at": r.bracket[1], "censored": r.censored,
            "probes": len(r.probes),
            "throughput_at_capacity_tok_s": float(at["throughput_tok_s"].iloc[0]) if len(at) else None,
            "baseline": baseline,
            "capacity_vs_baseline": r.capacity / base if r.capacity is not None and base else None,
        })
    return pd.DataFrame(rows)


# ---- (c) latency at one rate ------------------------------------------------------------------------

def latency_under_load(model, tokenizer, items: Sequence[WorkloadItem], rate: float, arms: Sequence[Sequence],
                       seed: int = 0, engine: Mapping | None = None, *, ignore_eos: bool = True,
                       progress: bool | None = None) -> pd.DataFrame:
    """Per-request latency of each arm serving the same seeded Poisson arrivals at ``rate``: one row per
    (arm, request) with ``e2el_s``, ``ttft_s``, ``tpot_s``, token counts and the status.

    What a user waits for at a given load, request by request, so two arms can be compared pair by pair
    (``e2e_ratio``). ``ignore_eos`` (default) makes every request produce its full budget in every arm,
    so an end-to-end latency measures the same work everywhere (batched arithmetic can flip a greedy
    token and end one arm's answer earlier)."""
    rows = []
    for arm in progress_bar(list(arms), progress=progress, desc="ch05 latency", leave=False):
        label = arm_label(arm)
        reqs, _ = _serve(model, tokenizer, items, _config(arm, engine), rate, seed, ignore_eos)
        for r in reqs:
            rows.append({"arm": label, "id": r.id, "rate": rate, "status": r.status.value, "arrival_s": r.arrival_s,
                         "e2el_s": r.e2el_s, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s,
                         "prompt_tokens": len(r.prompt_ids), "output_tokens": len(r.output_ids)})
    return pd.DataFrame(rows)


def latency_traces(model, tokenizer, make_items: Callable[[int], Sequence[WorkloadItem]], rate: float,
                   arms: Sequence[Sequence], seeds: Sequence[int], engine: Mapping | None = None, *,
                   ignore_eos: bool = True, progress: bool | None = None) -> pd.DataFrame:
    """``latency_under_load`` over independently seeded traces: trace ``s`` serves its own requests
    (``make_items(s)``) at its own seeded Poisson arrivals, every arm on the same ones; column ``trace``.
    Requests in one trace share its queue, so they are not independent: the trace is the unit."""
    frames = []
    for s in progress_bar(list(seeds), progress=progress, desc="ch05 load traces"):
        rows = latency_under_load(model, tokenizer, make_items(int(s)), rate, arms, int(s), engine,
                                  ignore_eos=ignore_eos, progress=False)
        frames.append(rows.assign(trace=int(s)))
    return pd.concat(frames, ignore_index=True)


def e2e_ratio_over_traces(rows: pd.DataFrame, treated: str, baseline: str, metric: str = "e2el_s") -> Estimate:
    """``baseline`` / ``treated`` end-to-end latency with the trace as the unit: each trace's requests that
    both arms finished are averaged per arm into one pair, and the ratio of the medians over traces gets a
    bootstrap CI that resamples whole traces (``ratio_estimate`` with ``units``); n = number of traces.
    > 1 means ``treated`` is faster."""
    a = rows[(rows["arm"] == baseline) & rows[metric].notna()].set_index(["trace", "id"])[metric]
    b = rows[(rows["arm"] == treated) & rows[metric].notna()].set_index(["trace", "id"])[metric]
    if not len(a) or not len(b):
        raise StudylibError(f"no {metric} for arm {baseline if not len(a) else treated!r}; "
                            f"arms present: {sorted(rows['arm'].unique())}.")
    both = a.index.intersection(b.index)
    if not len(both):
        raise StudylibError(f"arms {treated!r} and {baseline!r} finished no request in common.")
    return ratio_estimate(a.loc[both].to_numpy(), b.loc[both].to_numpy(),
                          units=[t for t, _ in both])


def e2e_ratio(rows: pd.DataFrame, treated: str, baseline: str, metric: str = "e2el_s") -> Estimate:
    """median(baseline ``metric``) / median(treated ``metric``) over the requests both arms finished, with
    a 95% bootstrap CI that resamples requests as pairs (``ratio_estimate``); n = number of requests.

    The ratio of medians, not the median of per-request ratios: it answers "how much longer does the
    typical request take", and is not dragged by requests whose latency is tiny in one arm (a request
    that arrived to an empty engine). > 1 means ``treated`` is faster."""
    a = rows[(rows["arm"] == baseline) & rows[metric].notna()].set_index("id")[metric]
    b = rows[(rows["arm"] == treated) & rows[metric].notna()].set_index("id")[metric]
    if not len(a) or not len(b):
        raise StudylibError(f"no {metric} for arm {baseline if not len(a) else treated!r}; "
                            f"arms present: {sorted(rows['arm'].unique())}.")
    both = a.index.intersection(b.index)
    if not len(both):
        raise StudylibError(f"arms {treated!r} and {baseline!r} finished no request in common.")
    return ratio_estimate(a.loc[both].to_numpy(), b.loc[both].to_numpy())


# ---- (d) cache-aware admission ---------------------------------------------------------------------

def _longest_shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """The longest prefix any two prompts share (neighbours in sorted order hold the answer)."""
    ordered = sorted(tuple(p) for p in prompts)
    best = 0
    for a, b in zip(ordered, ordered[1:], strict=False):
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        best = max(best, n)
    return best


def tight_kv_budget(model, tokenizer, items: Sequence[WorkloadItem], max_running: int, block_size: int = 16) -> float:
    """A KV budget (MiB) that holds ``max_running`` of the longest requests plus one shared prefix: room
    for the running set and about one cold system prompt in the cache, so which requests run together
    decides what the cache keeps."""
    reqs = to_requests(list(items), tokenizer)
    longest = max(r.max_total_tokens for r in reqs)
    shared = _longest_shared_prefix([r.prompt_ids for r in reqs])
    blocks = max_running * (-(-longest // block_size)) + -(-shared // block_size) + 1
    return blocks * block_size * _kv_token_bytes(model) / 2**20


def cache_aware_comparison(model, tokenizer, items: Sequence[WorkloadItem], rate: float, max_bypass: int = 16,
                           seed: int = 0, engine: Mapping | None = None, *, max_running: int = 4,
                           kv_budget_mib: float | None = None, progress: bool | None = None) -> pd.DataFrame:
    """Continuous batching with the radix cache, first come first served vs SGLang's longest-prefix-match
    admission bounded by ``max_bypass``, on the same arrivals (``items`` from ``shared_prefix_workload``:
    interleaved system prompts). One row per arm: prefix hit rate, throughput, p50/p99 TTFT, p99 e2e
    latency, and the most times any request was jumped over beside the bound.

    Admission order only matters when requests wait and the cache cannot keep every prefix. So the
    engine is deliberately small: ``max_running`` (default 4) requests in flight, so a queue forms, and a
    KV budget (``tight_kv_budget`` unless ``kv_budget_mib`` is given) that holds the running requests plus
    about one system prompt. FCFS then cycles A, B, C, ... through the cache and evicts each prefix before
    its next use; LPM runs the queued requests of the resident prefix together. Use more system prompts
    than ``max_running`` (e.g. 8 and 4): running requests pin their prefixes in the cache, so with as
    many slots as prompts FCFS keeps every prompt resident too. With a large budget both orders hit on
    nearly every request and the comparison shows nothing. These two options override ``engine``'s."""
    cfg = dict(engine or {})
    cfg.pop("num_blocks", None)
    budget = kv_budget_mib if kv_budget_mib is not None else tight_kv_budget(
        model, tokenizer, items, max_running, int(cfg.get("block_size", 16)))
    cfg.update(max_running=max_running, kv_budget_mib=budget)
    arms = [("FCFS", ("continuous", "radix", {"cache_aware": False})),
            (f"LPM (a request waits behind at most {max_bypass} bypassing)", ("continuous", "radix", {"cache_aware": True, "max_bypass": max_bypass}))]
    rows = []
    for name, arm in progress_bar(arms, progress=progress, desc="ch05 cache-aware", leave=False):
        reqs, run = _serve(model, tokenizer, items, _config(arm, cfg), rate, seed)
        s = run.summary()
        rows.append({"arm": f"continuous+radix {name}", "cache_aware": arm[2]["cache_aware"],
                     "max_bypass_bound": max_bypass if arm[2]["cache_aware"] else None,
                     "max_bypassed": s["max_bypassed"], "prefix_hit_rate": s["prefix_hit_rate"],
                     "throughput_tok_s": s["throughput_tok_s"], "requests_per_s": s["requests_per_s"],
                     "ttft_p50_s": _p(s, "ttft_s", "p50"), "ttft_p99_s": _p(s, "ttft_s", "p99"),
                     "e2el_p99_s": _p(s, "e2el_s", "p99"), "completed": s["requests"],
                     "preemptions": s["preemptions"], "max_running": max_running, "kv_budget_mib": budget,
                     "rate": rate})
    return why_not_measured(pd.DataFrame(rows), max_bypass_bound="first come, first served never lets a "
                                                                  "request skip ahead, so it needs no bound")


# ---- (e) fragmentation -----------------------------------------------------------------------------

def _weighted_mean(values: pd.Series, weights: pd.Series) -> float:
    w = weights.to_numpy(dtype=float)
    return float(np.average(values.to_numpy(dtype=float), weights=w)) if w.sum() > 0 else float(values.mean())


def kv_memory(timeline: pd.DataFrame | Sequence[Mapping]) -> dict:
    """KV memory of one run from its timeline: reserved and live bytes averaged over steps weighted by
    step time (so a long prefill counts for its duration) and at the step of peak reservation; waste =
    1 - live / reserved; batch size = sequences in a forward (time-weighted mean and max)."""
    tl = pd.DataFrame(list(timeline)) if not isinstance(timeline, pd.DataFrame) else timeline
    if not len(tl):
        raise StudylibError("the run has no steps, so there is no KV memory to report.")
    w = tl["step_s"]
    reserved, live = _weighted_mean(tl["kv_reserved_bytes"], w), _weighted_mean(tl["kv_live_bytes"], w)
    peak = tl.loc[tl["kv_reserved_bytes"].idxmax()]
    mib = 2.0**20
    return {"reserved_mean_mib": reserved / mib, "live_mean_mib": live / mib,
            "waste_mean": 1 - live / reserved if reserved else 0.0,
            "reserved_peak_mib": float(peak["kv_reserved_bytes"]) / mib,
            "live_at_peak_mib": float(peak["kv_live_bytes"]) / mib,
            "waste_at_peak": 1 - float(peak["kv_live_bytes"]) / float(peak["kv_reserved_bytes"])
            if peak["kv_reserved_bytes"] else 0.0,
            "mean_batch": _weighted_mean(tl["batch_seqs"], w), "max_batch": int(tl["batch_seqs"].max())}


def fragmentation(model, tokenizer, items: Sequence[WorkloadItem], kv_budget_mib: float,
                  engine: Mapping | None = None, *, max_running: int = 256, rate: float = math.inf,
                  seed: int = 0, progress: bool | None = None) -> pd.DataFrame:
    """Static padded batching vs the paged pool (continuous batching, no prefix cache) under the same KV
    memory budget, all requests at t = 0 by default so memory is what limits the batch.

    Static batching reserves a rectangle: every row as long as the longest prompt plus the longest output
    of its batch, held until the whole batch ends; the paged pool allocates a block when a sequence
    needs it and frees it when the sequence ends. Per arm (one row each): bytes reserved vs bytes
    holding live K/V (``Engine.kv_bytes``, time-weighted mean and at peak), the waste fraction, and the
    batch size each reaches in that budget (``kv_memory``), with throughput. ``max_running`` (default
    256) is set high so the budget, not the request cap, limits both batches."""
    cfg = {k: v for k, v in dict(engine or {}).items() if k not in ("num_blocks", "cache_aware")}
    cfg.update(kv_budget_mib=kv_budget_mib, max_running=max_running)
    rows = []
    for sched in progress_bar(["static", "continuous"], progress=progress, desc="ch05 fragmentation", leave=False):
        reqs, run = _serve(model, tokenizer, items, _config((sched, "none"), cfg), rate, seed)
        s = run.summary()
        rows.append({"arm": sched, "kv_budget_mib": kv_budget_mib, **kv_memory(run.timeline),
                     "throughput_tok_s": s["throughput_tok_s"], "completed": s["requests"], "steps": run.steps})
    return pd.DataFrame(rows)


# ---- (f) chunked prefill ---------------------------------------------------------------------------

def _serve_with_injections(engine: Engine, first: Sequence, later: Sequence[tuple[int, object]]) -> None:
    """Serve ``first`` from t = 0 and add each of ``later`` after its step count (arrival = that moment)."""
    engine.t0 = time.perf_counter()
    for r in first:
        engine.add_request(r)
    pending = sorted(later, key=lambda x: x[0])
    step = 0
    while pending or engine.has_work():
        while pending and (pending[0][0] <= step or not engine.has_work()):
            req = pending.pop(0)[1]
            req.arrival_s = engine.now()
            engine.add_request(req)
        engine.step()
        step += 1


def chunked_prefill_itl(model, tokenizer, decode_items: Sequence[WorkloadItem], long_items: Sequence[WorkloadItem],
                        chunk_sizes: Sequence[int | None], engine: Mapping | None = None, *,
                        long_after_steps: Sequence[int] | None = None, warmup: bool = True,
                        progress: bool | None = None) -> pd.DataFrame:
    """Inter-token latency of decodes that are already running while long prompts arrive, with each long
    prompt prefilled in one step (``chunk_size=None``) or in chunks of ``chunk_size`` tokens that share
    steps with the decodes (Sarathi-Serve's chunked prefill). A whole long prefill stalls every running
    decode for its duration; chunks bound the stall at the cost of a later first token for the long one.

    The decodes (``decode_items``, full budgets: EOS ignored) start at t = 0; long prompt i arrives after
    ``long_after_steps[i]`` engine steps (default: 2, 2 + g, 2 + 2g, ... with g a quarter of the
    shortest decode budget), counted in steps rather than seconds so the arrivals land inside the
    decodes on any machine. The token budget per step is raised to hold the longest long prompt plus
    every decode in one step, the same for every chunk size, so only the chunking differs. One row per
    chunk size: decode ITL p50 / p99 / max, long prompts' TTFT and the most steps one took from arrival
    to first token (``long_prefill_steps``), steps in all. ``warmup`` runs a short untimed
    pass first so the first arm does not pay one-off costs."""
    decode_items, long_items, chunk_sizes = list(decode_items), list(long_items), list(chunk_sizes)
    if not decode_items or not long_items or not chunk_sizes:
        raise StudylibError("chunked_prefill_itl needs at least one decode request, one long prompt and one "
                            "chunk size (None = the whole prompt in one step).")
    shortest = min(i.max_new_tokens for i in decode_items)
    if long_after_steps is None:
        gap = max(1, shortest // 4)
        long_after_steps = [2 + i * gap for i in range(len(long_items))]
    long_after_steps = list(long_after_steps)
    if len(long_after_steps) != len(long_items):
        raise StudylibError(f"long_after_steps has {len(long_after_steps)} entries for {len(long_items)} long prompts.")
    if max(long_after_steps) >= shortest:
        raise StudylibError(f"a long prompt arrives after step {max(long_after_steps)}, when the shortest decode "
                            f"(max_new_tokens {shortest}) may be done; raise the decodes' max_new_tokens.")
    longest = max(len(r.prompt_ids) for r in to_requests(long_items, tokenizer))
    cfg = dict(engine or {})
    cfg["max_batch_tokens"] = max(int(cfg.get("max_batch_tokens", 512)), longest + len(decode_items))
    cfg.setdefault("max_running", max(32, len(decode_items) + len(long_items)))
    cfg.setdefault("scheduler", "continuous")
    if warmup:
        short = [WorkloadItem(i.id, 2, i.prompt, i.messages, i.prompt_ids) for i in [*decode_items, long_items[0]]]
        Engine(model, EngineConfig(**{**cfg, "chunk_size": chunk_sizes[0]}), tokenizer).run(
            to_requests(short, tokenizer, ignore_eos=True))
    rows = []
    for chunk in progress_bar(chunk_sizes, progress=progress, desc="ch05 chunked prefill", leave=False):
        eng = Engine(model, EngineConfig(**{**cfg, "chunk_size": chunk}), tokenizer)
        decodes = to_requests(decode_items, tokenizer, ignore_eos=True)
        longs = to_requests(long_items, tokenizer, ignore_eos=True)
        _serve_with_injections(eng, decodes, list(zip(long_after_steps, longs, strict=True)))
        gaps = np.asarray([g for r in decodes for g in r.itl_s], dtype=float)
        ttft = np.asarray([r.ttft_s for r in longs if r.ttft_s is not None], dtype=float)
        ends = np.asarray([row["t"] for row in eng.timeline])
        prefill_steps = [int(((ends > r.arrival_s) & (ends <= r.token_times[0])).sum()) for r in longs if r.token_times]
        p50, p99 = (np.percentile(gaps, [50, 99]) if gaps.size else (math.nan, math.nan))
        rows.append({"chunk_size": "whole prompt" if chunk is None else int(chunk),
                     "max_batch_tokens": cfg["max_batch_tokens"], "decodes": len(decodes),
                     "long_prompts": len(longs), "long_prompt_tokens": longest, "itl_samples": int(gaps.size),
                     "itl_p50_s": float(p50), "itl_p99_s": float(p99),
                     "itl_max_s": float(gaps.max()) if gaps.size else math.nan,
                     "long_ttft_p50_s": float(np.median(ttft)) if ttft.size else math.nan,
                     "long_ttft_max_s": float(ttft.max()) if ttft.size else math.nan,
                     "long_prefill_steps": max(prefill_steps, default=0), "steps": eng.steps})
    return pd.DataFrame(rows)


# ---- reading the results ---------------------------------------------------------------------------

def long_prompt_items(tokenizer, n: int, tokens: int, seed: int = 0, max_new_tokens: int = 4) -> list[WorkloadItem]:
    """``n`` long prompts of about ``tokens`` tokens (NarrativeQA stories as the system prompt, one short
    question), for the chunked-prefill comparison."""
    systems = system_prompts(tokenizer, n, tokens, seed + 7)
    return [WorkloadItem(f"long-{i}", max_new_tokens, messages=[
        {"role": "system", "content": s}, {"role": "user", "content": "Summarise the story in one sentence."}])
        for i, s in enumerate(systems)]


def capacity_vs_sequential(cap: Capacity, saturation: pd.DataFrame, baseline: str = "sequential") -> pd.DataFrame:
    """The searched arm's capacity beside sequential serving's, bounded from its saturation runs.

    One request at a time, sequential serving completes at most its saturation request rate (its
    service rate, the median over repeats); arrivals any faster grow its queue without limit, so its
    capacity under any SLO is at most that rate. capacity / that rate is therefore a lower bound on the
    capacity gain, and it needs no search of the slow arm (a sweep at its rates would take minutes per
    probe). A single search: no CI (``capacity_table``'s caveat)."""
    service = request_rate(saturation, baseline)
    table = capacity_table([cap])
    table["sequential_service_rate_req_s"] = service
    table["capacity_gain_at_least"] = [c / service if c is not None else None for c in table["capacity_req_s"]]
    return table.drop(columns=["baseline", "capacity_vs_baseline"])


def explain_capacity(cap: Capacity, saturation: pd.DataFrame, slo: Mapping, tpot_factor: float) -> str:
    t = capacity_vs_sequential(cap, saturation).iloc[0]
    head = (f"SLO: p99 TPOT <= {slo['tpot_s'] * 1e3:.0f} ms ({tpot_factor:g}x this machine's single-request TPOT) "
            f"and p99 TTFT <= {slo['ttft_s']:.2f} s ({tpot_factor:g}x its single-request TTFT, the queue taken out). ")
    if cap.capacity is None:
        return head + _capacity_bound(cap, t.sequential_service_rate_req_s)
    bound = "at least " if cap.censored else ""
    achieved = float(_probe_at(cap, cap.capacity)["requests_per_s"])
    return head + (f"{cap.arm} sustains {bound}{cap.capacity:.2f} requests/s offered inside it "
                   f"({len(cap.probes)} probes of {int(cap.probes['requests'].iloc[0])} requests; that probe "
                   f"completed {achieved:.2f} requests/s, less than offered because a finite trace starts empty "
                   f"and drains at its end). Sequential serving's own capacity was not searched: it completes at "
                   f"most {t.sequential_service_rate_req_s:.2f} requests/s, so its capacity under any SLO is at most "
                   f"that, and the capacity gain is at least {t.capacity_gain_at_least:.2f}x "
                   f"({achieved / t.sequential_service_rate_req_s:.2f}x counted on completed requests), a floor, "
                   f"not a measured gain"
                   + (" (a floor below 1 does not say which serves more inside the SLO: sequential serving's p99 "
                      "latencies at the rates it was run are in the latency table)" if t.capacity_gain_at_least < 1
                      else "")
                   + f". {_binding(cap)} One search: no interval.")


def _probe_at(cap: Capacity, rate: float) -> dict:
    """The probe nearest ``rate``, as the search judged it: a missing value reads None, not NaN."""
    row = cap.probes.loc[(cap.probes["rate"] - rate).abs().idxmin()]
    return {k: None if not isinstance(v, str) and pd.isna(v) else v for k, v in row.items()}


def _binding(cap: Capacity) -> str:
    """Which limit stopped the search (the first rate missed above the capacity), and how close the other came."""
    if cap.bracket[1] is None:
        return "No probed rate missed the SLO, so neither limit bound."
    row = _probe_at(cap, cap.bracket[1])
    names = {"completed": "completion", "ttft_s": "the TTFT limit", "tpot_s": "the TPOT limit"}
    missed = _missed(row, cap.slo)
    kept = [names[k] for k in ("ttft_s", "tpot_s") if k in cap.slo and k not in missed]
    return (f"At {cap.bracket[1]:.2f} requests/s it missed {' and '.join(names[k] for k in missed)}"
            + (f"; {' and '.join(kept)} still held there." if kept else "."))


def _capacity_bound(cap: Capacity, service_rate: float) -> str:
    """Why no rate met the SLO, from the lowest probe: which limit it missed and by how much, at what load."""
    low = _probe_at(cap, float(cap.probes["rate"].min()))
    missed = []
    for key in _missed(low, cap.slo):
        if key == "completed":
            missed.append(f"{int(low['completed'])} of {int(low['requests'])} requests completed")
            continue
        name, col, unit, scale = {"ttft_s": ("TTFT", "ttft_p99_s", "s", 1.0),
                                  "tpot_s": ("TPOT", "tpot_p99_s", "ms", 1e3)}[key]
        value, limit = low[col], cap.slo[key]
        missed.append(f"p99 {name} not measured" if value is None else
                      f"p99 {name} {value * scale:.3g} {unit} against {limit * scale:.3g} {unit} "
                      f"({value / limit:.2f}x the limit)")
    load = f"{low['rate'] / service_rate:.2f}x sequential serving's service rate" if service_rate else "its load"
    return (f"{cap.arm} missed the SLO at every rate probed ({len(cap.probes)} probes, down to "
            f"{low['rate']:.2f} requests/s, {load}), so its capacity is below that. At that rate: "
            f"{'; '.join(missed) or 'the SLO was missed'}. Lower rates were not probed: each takes longer "
            f"(the same requests arrive further apart), and the search stops at its floor or its probe budget.")


def latency_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per arm: requests, median and p99 end-to-end latency and TTFT, median TPOT."""
    out = []
    for arm, g in rows.groupby("arm", sort=False):
        e, t, p = g["e2el_s"].dropna(), g["ttft_s"].dropna(), g["tpot_s"].dropna()
        out.append({"arm": arm, "rate_req_s": float(g["rate"].iloc[0]), "requests": len(g),
                    "completed": int((g["status"] == "finished").sum()),
                    "e2el_p50_s": float(e.median()), "e2el_p99_s": float(np.percentile(e, 99)),
                    "ttft_p50_s": float(t.median()), "ttft_p99_s": float(np.percentile(t, 99)),
                    "tpot_p50_s": float(p.median()) if len(p) else None})
    return pd.DataFrame(out)


def _unit(rows: pd.DataFrame) -> str:
    return "traces" if "trace" in rows.columns else "requests"


def explain_latency(rows: pd.DataFrame, est: Estimate, rate: float, load: float) -> str:
    t = latency_table(rows).set_index("arm")
    seq, ours = t.loc["sequential"], t.loc["continuous+radix"]
    how = (f"bootstrap over n = {est.n} independently seeded traces, each trace's requests averaged per arm"
           if _unit(rows) == "traces" else f"bootstrap over n = {est.n} requests, paired")
    pooled = seq.e2el_p50_s / ours.e2el_p50_s if ours.e2el_p50_s else float("nan")
    unit = ("with each trace's requests averaged, sequential serving takes" if _unit(rows) == "traces"
            else "request by request, sequential serving takes")
    return (f"At {rate:.2f} requests/s ({load:g}x sequential serving's service rate), the median request waits "
            f"{seq.e2el_p50_s:.2f} s end to end when served one at a time and {ours.e2el_p50_s:.2f} s with "
            f"continuous batching and the prefix cache (medians of all traces pooled: {pooled:.2f}x). "
            f"The ratio chapter 7 judges is of means, not of these medians: {unit} {est.value:.2f}x "
            f"[{est.ci_low:.2f}, {est.ci_high:.2f}] as long ({how}).")


def latency_record(rows: pd.DataFrame, est: Estimate, rate: float, load: float) -> dict:
    """What chapter 7 reads for C7's latency-under-load row."""
    return {"rate_req_s": rate, "load_vs_sequential_service_rate": load, "treated": "continuous+radix",
            "baseline": "sequential", "value": est.value, "ci": [est.ci_low, est.ci_high], "n": est.n,
            "method": est.method, "mc_error": est.mc_error, "unit": _unit(rows), "table": latency_table(rows).to_dict("records")}
