"""Chapter 7, part 4: the draft and decoder options, tables, the study-wide anchor table, the text that
reads the numbers, and the verdicts.

Verdicts come only from ``studylib.claims`` rules fed with the measurements: C7 is three rows
(quality retained, latency reduction, throughput gain), each judged per workload where it has one;
C8 is one decision over the measured interaction checks (``decide_conditions``), each named with its numbers;
modelled checks are shown and not counted.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import pkgutil
from collections.abc import Mapping, Sequence

import pandas as pd

from studylib.claims import (
    FAILS,
    INCONCLUSIVE,
    Verdict,
    ci_level,
    decide_conditions,
    decide_parts,
    judge_at_least,
    judge_checks,
)
from studylib.errors import StudylibError
from studylib.experiments import ch07_combined as cc
from studylib.experiments.ch05_interplay import EQUIVALENCE_DELTA, band_state, ttft_not_tpot
from studylib.experiments.ch05_runs import C8_BATCH
from studylib.experiments.ch07_quality import QUALITY_BAR
from studylib.experiments.ch07_stack import StackPlan, stack_arm_name
from studylib.experiments.ch07_system import BEST_POLICY, FORCED_POLICY, policy_name
from studylib.models import arithmetic
from studylib.verdict import guard
from studylib.workbook.tables import cell, key_words, span

LATENCY_BAR = 10.0  # "end-to-end latency reduced by more than 10x"
THROUGHPUT_BAR, THROUGHPUT_TOP = 8.0, 12.0  # "throughput raised 8-12x"

# Published end-to-end decoding speedups of trained-draft methods that no chapter reproduces (the
# chapters' own anchors, Orca and vLLM among them in chapter 5, are collected by ``anchors_frame``).
ANCHORS = [
    {"source": "Medusa (Cai et al., ICML 2024)", "hardware": "A100", "model": "Vicuna-7B/13B/33B, Zephyr-7B",
     "result": "over 2.2x (Medusa-1) and 2.3-3.6x (Medusa-2) decoding speedup"},
    {"source": "EAGLE (Li et al., ICML 2024)", "hardware": "A100", "model": "LLaMA2-Chat 70B",
     "result": "2.7-3.5x latency speedup, doubled throughput, output distribution unchanged"},
]


# ------------------------------------------------------------------------------------------- arms


def arms_frame(arms: Sequence[cc.Arm]) -> pd.DataFrame:
    def show(v):
        return v.describe() if hasattr(v, "describe") else v

    return pd.DataFrame([{"arm": a.name, "decoder": a.method, "prefix cache": a.prefix_cache,
                          "attention": a.attention or "dense", "lossless": a.lossless,
                          "options": cell({k: show(v) for k, v in a.options.items()})} for a in arms])


# ---------------------------------------------------------------------------------------- tables


def stack_frame(summary: pd.DataFrame, quality: pd.DataFrame, plans: Mapping[str, StackPlan], options,
                attention: str) -> pd.DataFrame:
    """The best stack per workload: latency reduction (e2e, TTFT, TPOT) with CIs and quality retained."""
    rows = []
    for wl, plan in plans.items():
        name = stack_arm_name(plan, options, attention)
        s = summary[(summary.workload == wl) & (summary.arm == name)].iloc[0]
        q = quality[(quality.workload == wl) & (quality.arm == name)].iloc[0]
        rows.append({"workload": wl, "stack": name, "requests": int(s.requests), "speedup": s.speedup,
                     "low": s.speedup_low, "high": s.speedup_high, "ttft_speedup": s.ttft_speedup,
                     "tpot_speedup": s.tpot_speedup, "quality": q.quality_retained, "q_low": q.retained_low,
                     "q_high": q.retained_high, "binding": q.binding})
    return pd.DataFrame(rows)


def anchors_frame(ours: Sequence[dict] = ()) -> pd.DataFrame:
    """Every chapter's published anchors (the ``ANCHORS`` of each ``studylib.experiments.chNN_*``
    module, imported, never retyped) in one table, then ``ours``. A module that fails to import is
    listed with the error instead of silently missing."""
    import studylib.experiments as pkg

    rows = []
    for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not (m.name.startswith("ch") and m.name[2:4].isdigit()):
            continue
        try:
            mod = importlib.import_module(f"studylib.experiments.{m.name}")
        except Exception as exc:  # another chapter mid-edit must not hide the rest of the table
            rows.append({"chapter": int(m.name[2:4]), "source": f"({m.name} failed to import: {exc})"})
            continue
        anchors = getattr(mod, "ANCHORS", None)
        if anchors is None:
            continue
        recs = anchors.to_dict("records") if hasattr(anchors, "to_dict") else list(anchors)
        rows += [_anchor_row(int(m.name[2:4]), r) for r in recs]
    rows += [{"chapter": 7, **r} for r in ours]
    df = pd.DataFrame(rows, columns=["chapter", "source", "result", "model", "hardware"])
    return df.drop_duplicates().reset_index(drop=True)


def _anchor_row(chapter: int, r: Mapping) -> dict:
    main = r.get("result", r.get("speedup"))
    skip = {"source", "hardware", "model", "result", "speedup"}
    # a published number is quoted as printed (never rounded): the key in words, the value as it stands, as a
    # phrase ("batch 1, tokens per second 104.9"), the headline number first with its conditions after it
    extra = ", ".join(f"{key_words(k)} {v}" for k, v in r.items()
                      if k not in skip and v is not None and v == v and v != "")
    result = extra if main is None else f"{main} ({extra})" if extra else f"{main}"
    return {"chapter": chapter, "source": r.get("source", ""), "result": result, "model": r.get("model", ""),
            "hardware": r.get("hardware", "")}


def ours_rows(stacks: pd.DataFrame, tput: pd.DataFrame, model: str, hardware: str) -> list[dict]:
    lat = ", ".join(f"{r.workload} {r.speedup:.2f}x" for r in stacks.itertuples())
    best = tput[tput.policy == "continuous + radix"]
    rows = [{"source": "this study, chapter 7 (measured)", "model": model, "hardware": hardware,
             "result": f"best-stack e2e latency reduction per workload, selection pass (one process, biased "
                       f"upward by the choice): {lat}"}]
    if len(best):
        rows.append({"source": "this study, chapter 7 (measured)", "model": model, "hardware": hardware,
                     "result": f"throughput at saturation, continuous + radix vs AR: {best.gain.iloc[0]:.2f}x"})
    return rows


def hardware_text() -> str:
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu} ({os.cpu_count()} cores, torch threads {torch.get_num_threads()}){gpu}"


def conditions_text(model, workloads: Mapping[str, cc.NamedWorkload], draft_note: str, attention: str,
                    which: str = "the confirmation run's fresh requests") -> str:
    """The verdicts' conditions. ``which``: whose requests ``workloads`` are; the verdicts read the
    confirmation run, whose requests differ from the selection pass's table at the top of the page, so
    their token ranges differ too and the text says whose they are."""
    wl = "; ".join(f"{n} x{len(w.requests)} ({min(len(r.tokens) for r in w.requests)}-"
                   f"{max(len(r.tokens) for r in w.requests)} prompt tokens)" for n, w in workloads.items())
    new = max(r.max_new_tokens for w in workloads.values() for r in w.requests)
    return (f"{model.config.name} ({arithmetic(model)}) on {hardware_text()}; greedy; "
            f"latency at batch 1, up to {new} new tokens; workloads ({which}): {wl}; draft: {draft_note}; "
            f"sparse attention: {attention}")


def serving_conditions(tput: pd.DataFrame, workloads: Sequence[str], max_running: int, new_tokens: int) -> str:
    n = int(tput.requests.iloc[0]) if len(tput) else 0
    return (f"throughput: {n} requests ({', '.join(workloads)}) all queued at t = 0, up to {new_tokens} new tokens, "
            f"at most {max_running} running, {tput.repeat.nunique() if len(tput) else 0} repeat(s)")


def prefix_row(summary: pd.DataFrame, workload: str = "system_prompt") -> pd.Series | None:
    """The prefix-cache arm's summary row on ``workload`` (None if that workload did not run)."""
    r = summary[(summary.workload == workload) & (summary.arm == cc.PREFIX)]
    return r.iloc[0] if len(r) else None


# ------------------------------------------------------------------------------------------ verdicts


def _est(value, low, high, n=None, method=None, mc_error=0.0) -> dict:
    """An estimate read back from a chapter's JSON, keeping how its CI was taken and its bound's own error
    (Monte Carlo or run-to-run), so the rules read it exactly as the chapter that measured it would. A missing
    method or error (None, or NaN from a table cell) is the rules' to read (``claims.as_point``)."""
    return {"value": float(value), "ci_low": float(low), "ci_high": float(high), "n": None if n is None else int(n),
            "method": method, "mc_error": mc_error}


CONFIRMATION_WHY = (
    "The stacks were chosen as the best of several noisy candidates, so the speed-ups they showed while being "
    "chosen are biased upwards. The confirmation run draws fresh requests and runs each chosen stack against "
    "AR again, interleaved: C7's verdict reads it. Its figures differ from the selection pass's by that bias "
    "and by the spread between two sets of requests; the table below sets the two side by side. The verdict "
    "itself reads five whole runs (fresh processes) of the confirmation requests, so its value and interval differ "
    "again, a little, from the confirmation table's one process. C8's checks "
    "read the selection pass, where nothing they judge was picked by its own number: the prefix cache on the "
    "shared-system-prompt workload and the sparse pattern are declared before the run, and the stacking check "
    "reads each stack the plan built from the single techniques, before the stack itself was measured.")


def selection_vs_confirmation(selected: pd.DataFrame, confirmed: pd.DataFrame) -> pd.DataFrame:
    """Each chosen stack's end-to-end speed-up and TTFT gain in the selection pass and in the confirmation
    run, side by side, so a number that appears in both places carries the other beside it."""
    def ci(r, v, lo=None, hi=None):
        if pd.isna(r.get(v)):
            return "-"  # not measured
        return _ci(r[v], r.get(lo), r.get(hi)) if lo else f"{r[v]:.2f}"

    rows = []
    conf = {(r.workload, r.stack): r for r in confirmed.itertuples()}
    for r in selected.to_dict("records"):
        c = conf.get((r["workload"], r["stack"]))
        if c is None:
            continue
        c = c._asdict()
        rows.append({"workload": r["workload"], "stack": r["stack"],
                     "speed-up, selection pass": ci(r, "speedup", "low", "high"),
                     "speed-up, confirmation run": ci(c, "speedup", "low", "high"),
                     "TTFT gain, selection pass": ci(r, "ttft_speedup"),
                     "TTFT gain, confirmation run": ci(c, "ttft_speedup"),
                     "requests (selection / confirmation)": f"{int(r['requests'])} / {int(c['requests'])}"})
    return pd.DataFrame(rows)


def confirm_stacks(model, tokenizer, workloads: Mapping[str, cc.NamedWorkload], plans: Mapping[str, StackPlan],
                   options, attention: str, block_size: int = 16, capacity_tokens: int = 8192) -> pd.DataFrame:
    """The chosen stack of each workload against the AR baseline, on FRESH requests (``workloads`` built
    with another seed), the two arms interleaved per request. The stacks were chosen as the best of
    several noisy candidates on the exploration requests, so their exploration speed-ups are biased
    upwards; the verdict reads this confirmation run instead."""
    from studylib.experiments.ch07_stack import make_arm

    per = {}
    for wl, plan in plans.items():
        if wl in workloads:
            per[wl] = [make_arm((), options, attention)] + ([make_arm(plan.stack, options, attention)]
                                                           if plan.stack else [])
    return cc.run_arms(model, tokenizer, workloads, per, block_size=block_size, capacity_tokens=capacity_tokens)


def latency_confidence() -> tuple[float, int]:
    """The level of C7's latency CIs and how many workloads they are corrected for (Bonferroni over the
    workloads C7@7 declares: the part holds where any one workload's CI clears the bar)."""
    from studylib.decisions import level

    return level("C7", cc.CHAPTER)


def judge_latency(stacks: pd.DataFrame, conditions: str, runs=None) -> Verdict:
    """Per workload, the settled stack's e2e speed-up over AR. With ``runs`` (``ch07_runs.latency_run``
    whole runs) it is judged over them, at the level corrected for the declared workloads, and the
    confirmation run's per-request CIs are shown beside it; without runs, the per-request CIs are judged,
    and as whole runs are declared they count none."""
    from studylib.experiments.ch07_runs import latency_over_runs

    beside = "in the confirmation run, over requests (shown, not deciding): " + "; ".join(
        f"{r.workload} {r.speedup:.3g} [{r.low:.3g}, {r.high:.3g}]" for r in stacks.itertuples())
    if runs is None:
        est = {r.workload: _est(r.speedup, r.low, r.high, r.requests) for r in stacks.itertuples()}
        return judge_at_least("C7", "e2e latency reduction, chosen stack vs AR (x), confirmation run", est,
                              LATENCY_BAR, ">10x", conditions, cc.CHAPTER, unit="whole runs")
    confidence, k = latency_confidence()
    # A workload whose settled stack is AR itself times AR against AR: its ratio is 1 by construction, so
    # it is named and never counted among the conditions (the family stays the k declared workloads).
    same = [r.workload for r in stacks.itertuples() if r.stack == cc.BASELINE]
    real = [w for w in stacks.workload if w not in same]
    left = f"not counted, AR timed against itself: {', '.join(same)}" if same else ""
    note = (f"{len(runs.runs)} whole runs (fresh processes, engine and drafter reloaded) of each settled stack "
            f"against AR on the confirmation requests; each CI at {confidence:.2%}, Bonferroni over the {k} "
            "declared workloads")
    metric = "e2e latency reduction, chosen stack vs AR (x), over whole runs"
    if not real:  # the search found no stack faster than AR anywhere: no reduction at all, a finding
        return judge_checks("C7", metric + ": no workload settled on a stack other than AR",
                            {"a stack other than AR settled on some workload": False}, ">10x",
                            "; ".join((conditions, left, beside)), cc.CHAPTER, role="part")
    est = latency_over_runs(runs, real, confidence)
    return judge_at_least("C7", metric, est, LATENCY_BAR, ">10x",
                          "; ".join(x for x in (conditions, note, left, beside) if x), cc.CHAPTER,
                          unit="whole runs", confidence=confidence, tried=k)


def judge_quality(stacks: pd.DataFrame, conditions: str) -> list[Verdict]:
    """Per workload, the quality the chosen stack kept on the confirmation requests.

    A lossless stack (``binding`` "exact match") is an exactness check, not an estimate: its greedy output
    equals AR's on every confirmation request or it does not (one mismatch fails it); a CI over ratios
    that are all 1 would be a degenerate [1, 1]. A lossy stack is judged on the worst of greedy agreement,
    task-score ratio and 1/perplexity ratio, with its CI. So the part is one row per kind of stack present:
    an exactness row, a CI row, or both."""
    # A workload whose chosen stack is AR itself compares AR with AR: it cannot fail, so it is named and
    # left out of the conditions; when every stack is AR the row is shown and not counted.
    same = [r.workload for r in stacks.itertuples() if r.stack == cc.BASELINE]
    real = [r for r in stacks.itertuples() if r.stack != cc.BASELINE]
    left = f"not counted, AR compared with itself: {', '.join(same)}" if same else ""
    if not real:
        checks = {r.workload: r.quality >= 1.0 for r in stacks.itertuples()}
        return [judge_checks("C7", "quality retained: every chosen stack is AR itself, compared with AR", checks,
                             ">99%", conditions, cc.CHAPTER, role="part", unit="requests",
                             n=int(stacks.requests.sum()), by_construction=True)]
    exact = [r for r in real if r.binding == "exact match"]
    lossy = [r for r in real if r.binding != "exact match"]
    rows = []
    if exact:
        checks = {f"{r.workload} ({r.stack}): {r.quality:.0%} of {int(r.requests)} identical": r.quality >= 1.0
                  for r in exact}
        rows.append(judge_checks("C7", "greedy output of the chosen lossless stack identical to AR on every "
                                 "confirmation request", checks, ">99%", "; ".join(x for x in (conditions, left) if x),
                                 cc.CHAPTER, role="part", unit="requests", n=int(sum(r.requests for r in exact))))
    if lossy:
        est = {r.workload: _est(r.quality, r.q_low, r.q_high, r.requests) for r in lossy}
        how = "the worst of greedy agreement, task-score ratio and 1/perplexity ratio"
        rows.append(judge_at_least("C7", "quality retained by the chosen lossy stack (worst measure)", est,
                                   QUALITY_BAR, ">99%", "; ".join(x for x in (conditions, how, left) if x),
                                   cc.CHAPTER, unit="requests"))
    return rows


FORCED_METRIC = "throughput at saturation vs AR one at a time, forced stack (x)"


def judge_throughput(tsum: pd.DataFrame, conditions: str, policy: str = BEST_POLICY) -> Verdict:
    """C7's throughput part for one serving stack: the selected one (``BEST_POLICY``) or the forced one
    (``FORCED_POLICY``: prompt lookup inside the batch too), each its own declared row."""
    r = tsum[tsum.policy == policy].iloc[0]
    note = f"above the claimed 8-12x range ({r.gain:.3g}x)" if r.gain > THROUGHPUT_TOP else ""
    n = int(r.repeats) if "repeats" in tsum.columns else None
    metric = FORCED_METRIC if policy == FORCED_POLICY else "throughput at saturation vs AR one at a time (x)"
    return judge_at_least("C7", metric,
                          _est(r.gain, r.gain_low, r.gain_high, n, r.get("method"), r.get("mc_error")), THROUGHPUT_BAR, "8-12x",
                          "; ".join(x for x in (f"{policy}", conditions, note) if x), cc.CHAPTER, unit="whole runs")


def judge_latency_under_load(load: Mapping, serving: str) -> Verdict:
    """C7's "end-to-end latency" read as a user at a given arrival rate sees it, queueing included:
    sequential AR serving / continuous batching + prefix cache at the same Poisson arrivals (chapter 5)."""
    unit = load.get("unit", "requests")
    est = _est(load["value"], load["ci"][0], load["ci"][1], load.get("n"), load.get("method"), load.get("mc_error"))
    how = (f"chapter 5's latency under load: {load.get('n')} {unit} at {load['rate_req_s']:.2f} requests/s, "
           f"{load['baseline']} against {load['treated']} on the same seeded Poisson arrivals"
           + (", each trace its own requests and arrivals, resampled whole" if unit == "traces" else ""))
    return judge_at_least("C7", f"e2e latency under load at {load['rate_req_s']:.2f} req/s "
                          f"({load['load_vs_sequential_service_rate']:g}x sequential's service rate), sequential / "
                          f"{load['treated']} (x)", est, LATENCY_BAR, ">10x", how, cc.CHAPTER, unit=unit)


def judge_c7(stacks: pd.DataFrame, tsum: pd.DataFrame, conditions: str, serving: str,
             under_load: Mapping | None = None, latency_runs=None) -> list[Verdict]:
    """C7 is one sentence with three parts that must all hold: quality kept AND latency cut >10x AND
    throughput raised 8-12x. Quality and latency are judged on the same configuration (each workload's
    chosen stack, confirmation run); throughput on the serving stack. "End-to-end latency" has a second
    reading, what a user waits for at a given load (chapter 5's latency under load): when chapter 5 has
    measured it, it is a fourth part. The forced stack (``FORCED_POLICY``: prompt lookup inside the continuous
    batch with the radix cache, declared before the run) is a throughput part of its own beside the selected
    serving stack. The decision is the weakest part (all must hold, so no correction for the extra part)."""
    parts = [*judge_quality(stacks, conditions), judge_latency(stacks, conditions, latency_runs),
             judge_throughput(tsum, f"{conditions}; {serving}")]
    if FORCED_POLICY in set(tsum.policy):  # the declared forced stack is a part of its own: both must clear
        parts.append(judge_throughput(tsum, f"{conditions}; {serving}", FORCED_POLICY))
    if under_load:
        parts.append(judge_latency_under_load(under_load, serving))
    return decide_parts("C7", "quality AND latency AND throughput at once", parts,
                        ">99% quality, >10x lower latency, 8-12x throughput", conditions, cc.CHAPTER)


C8_PREFIX, C8_SPARSE, C8_STACK = ("prefix cache helps TTFT, not TPOT", "sparse attention gain grows with context",
                                  "stacked gains fall short of the product of their parts")
# decide_conditions' names for the measured interactions, as C8@7 declares its configurations
C8_NAMES = {C8_PREFIX: "prefix: TTFT not TPOT", C8_SPARSE: "sparse gain grows with context",
            C8_STACK: "stack below the product of its parts"}


def _ci(value, low, high, missing: str = "", unit: str = "") -> str:
    """A value with its CI, or the value alone (then ``missing``) where a bound is absent: never 'nan'."""
    if pd.notna(low) and pd.notna(high):
        return f"{value:.2f}{unit} [{low:.2f}, {high:.2f}]"
    return f"{value:.2f}{unit}{missing}"


def c8_confidence() -> float:
    """The level of every CI C8@7's checks compare: Bonferroni over the interactions it declares (each a
    condition that could carry the decision on its own)."""
    from studylib.decisions import level

    return level("C8", cc.CHAPTER)[0]


def c8_checks(spec_gain: pd.DataFrame, prefix: pd.Series | None, sparse: pd.DataFrame,
              interactions: pd.DataFrame, delta: float = EQUIVALENCE_DELTA,
              confidence: float | None = None, growth_runs=None, batch_runs=None) -> dict[str, dict]:
    """The interaction checks, each named with the numbers that decide it, its unit and n, and whether
    it is measured. Each entry: ``passed`` (the rule), ``checks`` (the named conditions behind it),
    ``measured``, ``kind`` (``C8_PREFIX``/``C8_SPARSE``/``C8_STACK``, or "model"), ``n``, ``unit``,
    ``estimate`` (the number the verdict table shows).

    - speculative gain vs batch: a MODEL (measured step costs x measured alpha), shown, never counted;
    - prefix cache helps TTFT, not TPOT (requests, SHOWN, never deciding): the TTFT gain's CI at or above
      1 + delta AND the TPOT gain's CI inside [1 - delta, 1 + delta] (chapter 5's rule and its one declared
      band, ``EQUIVALENCE_DELTA``). Its requests share one cache inside one process, so it cannot decide a
      speed-up; chapter 5 decides this interaction over whole runs (C8@5);
    - sparse attention gain grows with context (whole runs, DECIDING): with ``growth_runs`` (the latency
      whole runs, ``ch07_runs.sparse_growth_run``), per run the median over its texts of (speed-up at the
      longest context / at the shortest); passes iff the CI over runs of that ratio lies above 1 AND the CI
      of the speed-up at the longest context lies above 1 (a loss that shrinks is no gain that grows), each
      bound clear of 1 by its Monte Carlo error. The in-process per-prompt reading (``sparse``,
      ``ch07_system.sparse_growth``) is shown beside it; without runs the row counts no whole runs;
    - stacked gains fall short of the product of their parts (requests, SHOWN, never deciding): a speed-up
      ratio over requests in one run; ``interactions`` carries CIs corrected for the workloads tried;
    - speculation's gain shrinks inside the batch (whole runs, SHOWN here, decided in chapter 5 as a part of
      C8@5): from ``batch_runs``, chapter 5's whole runs of the forced stack, per run prompt lookup's
      throughput gain inside the continuous + radix batch over its gain one request at a time
      (``ch05_runs.lookup_interactions``); passes iff that ratio's CI lies below 1.
    """
    from studylib.claims import min_units
    from studylib.experiments.ch07_system import sparse_growth

    confidence = c8_confidence() if confidence is None else confidence  # C8's family level by default
    checks: dict[str, dict] = {}
    if len(spec_gain) >= 2:
        a, b = spec_gain.iloc[0], spec_gain.iloc[-1]
        checks[f"speculative gain shrinks with batch (model: B={int(a.batch)}: {a.gain:.2f}x -> "
               f"B={int(b.batch)}: {b.gain:.2f}x)"] = {"passed": bool(b.gain < a.gain), "measured": False,
                                                      "kind": "model"}
    if prefix is not None:
        ttft = (prefix.ttft_speedup, prefix.ttft_low, prefix.ttft_high, int(prefix.requests))
        tpot = (prefix.tpot_speedup, prefix.tpot_low, prefix.tpot_high, int(prefix.requests))
        rule = ttft_not_tpot(ttft, tpot, delta)
        # three outcomes: both CIs on the claim's side (holds), either wholly on the wrong side (does not
        # hold), or a CI across its bound (neither: inconclusive, never "does not hold")
        wrong = (band_state(ttft[1], ttft[2], 1 + delta, math.inf) == "outside"
                 or band_state(tpot[1], tpot[2], 1 - delta, 1 + delta) == "outside")
        neither = not all(rule["not_tpot"].values()) and not wrong
        checks[f"{C8_PREFIX} ({prefix.workload}: TTFT gain {_ci(*ttft[:3])}, TPOT gain {_ci(*tpot[:3])}, "
               f"{ci_level(confidence)} CIs, n={int(prefix.requests)} requests; delta = {delta:g})"] = {
            "passed": all(rule["not_tpot"].values()), "checks": rule["not_tpot"], "measured": False, "kind": C8_PREFIX,
            "shown": True,
            "n": int(prefix.requests), "unit": "requests", "estimate": _est(*tpot), "confidence": confidence,
            "tpot_too": all(rule["tpot_too"].values()), "delta": delta, "neither": neither}
    growth = sparse_growth(sparse, confidence=confidence) if len(sparse) and "prompt" in sparse else None
    if growth is not None:
        name = f"CI of (gain at {growth['longest']} / gain at {growth['shortest']}) above 1"
        # a gain that grows from 0.5x to 0.8x is a loss that shrinks: the claim needs a gain at the long context
        at_long = f"CI of the speed-up at {growth['longest']} tokens above 1"
        gain_low = growth.get("gain_longest_low", float("nan"))
        in_run = (f"in one process, per prompt: {_ci(growth['value'], growth['ci_low'], growth['ci_high'])}, "
                  f"n={growth['n']} prompts, median speed-ups {growth['gain_shortest']:.2f}x -> "
                  f"{growth['gain_longest']:.2f}x, shown")
        from studylib.experiments.ch07_runs import GAIN_LONG, GROWTH

        g = growth_runs.get(GROWTH, confidence) if growth_runs is not None else None
        at = growth_runs.get(GAIN_LONG, confidence) if growth_runs is not None else None
        if g is not None and at is not None:
            sub = {name: bool(g.ci_low - guard(g.mc_error) > 1), at_long: bool(at.ci_low - guard(at.mc_error) > 1)}
            checks[f"{C8_SPARSE} (over whole runs, decode speed-up at {growth['longest']} tokens / at "
                   f"{growth['shortest']}: {_ci(g.value, g.ci_low, g.ci_high)}, speed-up at {growth['longest']}: "
                   f"{_ci(at.value, at.ci_low, at.ci_high)}, {ci_level(confidence)} CIs, n={g.n} whole runs; "
                   f"{in_run})"] = {
                "passed": all(sub.values()), "checks": sub, "measured": True, "kind": C8_SPARSE, "n": int(g.n),
                "unit": "whole runs", "confidence": confidence, "estimate": g}
        else:
            sub = {name: bool(growth["ci_low"] > 1), at_long: bool(gain_low > 1)}
            checks[f"{C8_SPARSE} (no whole runs; {in_run})"] = {
                "passed": all(sub.values()), "checks": sub, "measured": True, "kind": C8_SPARSE, "n": 0,
                "unit": "whole runs", "confidence": confidence,
                "estimate": _est(growth["value"], growth["ci_low"], growth["ci_high"], growth["n"])}
    if len(interactions):
        need = min_units("requests")
        conf = float(interactions.confidence.iloc[0]) if "confidence" in interactions else 0.95
        below = interactions[(interactions.high < 1) & (interactions.requests >= need)]
        # n: the passing workload's requests; when none passes, the fewest any workload had (a workload
        # with too few requests might have passed, so the row cannot fail on it)
        n = int(below.requests.max()) if len(below) else int(interactions.requests.min())
        cand = below if len(below) else interactions
        shown = cand.loc[cand.high.idxmin()] if cand.high.notna().any() else cand.iloc[0]
        vals = "; ".join(f"{r.workload} {_ci(r.ratio, r.low, r.high)} (n={int(r.requests)})"
                         for r in interactions.itertuples())
        passed = bool(len(below))
        checks[f"{C8_STACK} (stack / product of parts: {vals}; {conf:.1%} CIs, {len(interactions)} workload(s) "
               "tried)"] = {
            "passed": passed, "checks": {"on at least one workload the CI lies wholly below 1": passed},
            "measured": False, "shown": True, "kind": C8_STACK, "n": n, "unit": "requests", "confidence": conf,
            "estimate": _est(shown.ratio, shown.low, shown.high, int(shown.requests))}
    else:
        # declared, but there is nothing to compare: the page says so rather than dropping the row
        checks[f"{C8_STACK}: not measured (no workload's settled stack combines two or more techniques, so "
               "there is no product of parts to compare it with)"] = {"passed": False, "measured": False,
                                                                      "kind": "unmeasured"}
    checks.update(batch_check(batch_runs, confidence))
    return checks


def batch_check(batch_runs, confidence: float) -> dict[str, dict]:
    """The forced stack's C8 reading, "speculation's gain shrinks inside the batch", from chapter 5's whole
    runs (``ch05_runs.batch_readings``): shown here beside this chapter's interactions, decided in chapter 5
    (C8@5), where its runs are."""
    from studylib.experiments.ch05_batching import base_arm
    from studylib.experiments.ch05_runs import batch_readings

    readings = batch_readings(batch_runs, confidence) if batch_runs is not None else []
    if not readings:
        return {f"{C8_BATCH}: not measured (chapter 5's whole runs served no arm with prompt lookup inside the "
                "batch beside the same lookup one request at a time)": {"passed": False, "measured": False,
                                                                       "kind": "unmeasured"}}
    out = {}
    for r in readings:
        e = r["estimate"]
        out[f"{C8_BATCH} (prompt lookup's throughput gain inside the {policy_name(base_arm(r['arm']))} batch / its "
            "gain one "
            f"request at a time: {_ci(e.value, e.ci_low, e.ci_high)}, {ci_level(confidence)} CIs, n={e.n} whole runs; "
            "decided in chapter 5)"] = {
            "passed": r["state"] == "below", "measured": False, "shown": True, "kind": C8_BATCH, "n": int(e.n),
            "unit": "whole runs", "confidence": confidence, "estimate": e}
    return out


def _c8_tried() -> int:
    from studylib.decisions import level

    return level("C8", cc.CHAPTER)[1]


def judge_c8(checks: Mapping[str, dict], conditions: str) -> list[Verdict]:
    """One decision over the measured interactions, each a condition of its own (declared as C8@7);
    every row compares CIs (``exact=False``), so below its unit's minimum n it is inconclusive whichever
    way it went. Modelled checks are listed in the conditions and decide nothing."""
    measured = {k: v for k, v in checks.items() if v["measured"]}
    if not measured:
        raise StudylibError("no measured interaction to judge C8 with; run the interaction cells.")
    rows = []
    for name, v in measured.items():
        row = judge_checks("C8", name, v.get("checks") or {name: v["passed"]}, "gains are local and interact",
                           conditions, cc.CHAPTER, measured=v.get("estimate"), n=v.get("n"), unit=v.get("unit"),
                           exact=False, confidence=v.get("confidence", 0.95),
                           tried=_c8_tried() if v.get("confidence", 0.95) != 0.95 else None)
        if row.confidence != 0.95:  # the note goes last, after the checks' own
            row.conditions = (f"{row.conditions}; {ci_level(row.confidence)} CIs, Bonferroni-corrected for the "
                              "interactions (and workloads) tried")
        if v.get("neither") and row.verdict == FAILS:
            # an equivalence CI across the band's edge is no evidence either way
            # and its unmet checks are "not shown", not "failed": the reading is undecided either way
            undecided = row.conditions.replace("; fails: ", "; not shown: ", 1)
            row = dataclasses.replace(row, verdict=INCONCLUSIVE, conditions=f"{undecided}; neither: a CI "
                                      "crosses its bound, so the reading is not decided")
        rows.append(row)
    models = [k for k, v in checks.items() if not v["measured"] and v.get("kind") == "model"]
    unmeasured = [k for k, v in checks.items() if not v["measured"] and v.get("kind") == "unmeasured"]
    shown = [f"{k}: {'passes' if v['passed'] else 'does not pass'}" for k, v in checks.items()
             if not v["measured"] and v.get("shown")]
    note = "; ".join(x for x in (f"not counted (models): {'; '.join(models)}" if models else "",
                                 "shown, not deciding (this chapter's prefix and stacking readings are speed-ups "
                                 "over requests inside one process; chapter 5 decides the prefix interaction and "
                                 f"speculation inside the batch over whole runs): {'; '.join(shown)}"
                                 if shown else "",
                                 f"{'; '.join(unmeasured)}" if unmeasured else "") if x)
    return decide_conditions("C8", "measured interactions of the stacked gains", rows,
                             "gains are local and interact", "; ".join(x for x in (conditions, note) if x),
                             cc.CHAPTER, names=[C8_NAMES.get(v.get("kind"), k) for k, v in measured.items()])


# ---------------------------------------------------------------------------------- interpretation


def latency_text(stacks: pd.DataFrame) -> str:
    """One paragraph that stays true whatever the numbers are: it reads them."""
    per = "; ".join(f"{r.workload}: {r.stack} {r.speedup:.2f}x [{r.low:.2f}, {r.high:.2f}]" for r in stacks.itertuples())
    reach = stacks[stacks.low >= LATENCY_BAR]
    best = stacks.loc[stacks.speedup.idxmax()]
    return (f"Best stack per workload in the selection pass (e2e speedup over AR, 95% CI over requests in one "
            f"process, biased upward by the choice; the confirmation run and the verdict's whole runs below re-measure "
            f"it): {per}. {len(reach)} of {len(stacks)} workloads "
            f"reach the claimed {LATENCY_BAR:g}x with the whole CI above it; the largest reduction is "
            f"{best.speedup:.2f}x on {best.workload}.")


def quality_text(quality: pd.DataFrame) -> str:
    lossless = quality[quality.lossless & (quality.arm != cc.BASELINE)]
    bad = lossless[lossless.exact_match < 1.0]
    out = (f"Lossless arms reproduced the baseline's greedy tokens exactly on {len(lossless) - len(bad)} of "
           f"{len(lossless)} (workload, arm) pairs")
    out += "." if bad.empty else ("; not on " + ", ".join(f"{r.workload}/{r.arm} ({r.exact_match:.0%} of requests)"
                                                         for r in bad.itertuples()) + ".")
    lossy = quality[~quality.lossless]
    if len(lossy):
        ppl = lossy.ppl_ratio.dropna()
        out += (f" Lossy arms kept {span(lossy.agreement.min(), lossy.agreement.max())} greedy agreement with the "
                f"baseline" + (f" at a perplexity ratio of {ppl.iloc[0]:.3f}" if len(ppl) else "")
                + f"; quality retained (worst measure) {span(lossy.quality_retained.min(), lossy.quality_retained.max())}.")
    return out


def _gain_words(r) -> str:
    """A policy's gain with its CI, or the gain alone where its arm has no CI (too few whole runs, or a run
    without a positive value): a missing bound is said, never printed as 'nan'."""
    return _ci(r.gain, r.gain_low, r.gain_high, " (no CI over whole runs)", unit="x")


def throughput_text(tsum: pd.DataFrame) -> str:
    per = "; ".join(f"{r.policy}: {r.throughput_tok_s:.1f} tok/s ({_gain_words(r)})" for r in tsum.itertuples())
    best = tsum.loc[tsum.gain.idxmax()]
    return (f"Output tokens per second with every request queued at t = 0, and the gain over AR one at a time: {per}. "
            f"The highest is {best.policy} at {best.gain:.2f}x; the claim is {THROUGHPUT_BAR:g}-{THROUGHPUT_TOP:g}x.")


def forced_text(tsum: pd.DataFrame, batch_runs=None) -> str:
    """The forced stack beside the selected serving stack, in words, from the same numbers C7 and C8 judge:
    each one's gain over AR one at a time and, from chapter 5's whole runs, what adding prompt lookup to
    the batch did to its throughput."""
    pol = set(tsum.policy)
    if FORCED_POLICY not in pol:
        return ("The forced stack (continuous batching + radix cache + prompt lookup inside the batch) was not served "
                "here, so this page cannot say what prompt lookup adds to a batch.")
    f = tsum[tsum.policy == FORCED_POLICY].iloc[0]
    head = (f"The forced stack, {FORCED_POLICY}, declared before the run, serves {f.throughput_tok_s:.1f} tokens per "
            f"second, {_gain_words(f)} AR one at a time")
    if BEST_POLICY in pol:
        b = tsum[tsum.policy == BEST_POLICY].iloc[0]
        head += (f", beside the selected {BEST_POLICY} at {b.throughput_tok_s:.1f} tokens per second, "
                 f"{_gain_words(b)}")
    head += ". "
    from studylib.experiments.ch05_batching import base_arm

    arm = f.get("arm") if "arm" in tsum.columns else None
    # the forced arm over itself without the lookup, as chapter 5's whole runs name that gain
    e = batch_runs.get(f"gain:{arm}/{base_arm(arm)}") if batch_runs is not None and isinstance(arm, str) else None
    if e is None:
        return head + "Both are judged for C7's throughput part (all parts must hold)."
    effect = ("costs throughput" if e.ci_high < 1 else "adds throughput" if e.ci_low > 1 else
              "changes throughput by less than these runs can resolve")
    why = (" Each drafted token takes a row of a batched step that is already full, so it is paid at the step's "
           "price instead of riding on idle compute." if e.ci_high < 1 else "")
    return head + (f"Over chapter 5's {e.n} whole runs, adding prompt lookup to the batch {effect}: {e.value:.2f}x "
                   f"[{e.ci_low:.2f}, {e.ci_high:.2f}] (95% CI over runs).{why} Both stacks are judged for C7's "
                   "throughput part (all parts must hold), and chapter 5's C8 row judges how the lookup's gain "
                   "changes between one request and the batch.")


def checks_text(checks: Mapping[str, dict]) -> str:
    """One line per interaction check, with its rule's outcome; a check resting on fewer units than its
    minimum says it decides nothing, and a prefix cache that also shortened TPOT is reported as such."""
    from studylib.claims import min_units

    lines = []
    for name, v in checks.items():
        word = "passes" if v["passed"] else "fails"
        if v.get("kind") == "unmeasured":
            lines.append(f"- {name}")
            continue
        if not v["measured"]:
            why = "shown, not deciding: in one process" if v.get("shown") else "model, not counted"
            lines.append(f"- {word} ({why}): {name}")
            if v.get("kind") == C8_PREFIX and v.get("tpot_too"):
                lines.append("  (the prefix cache also shortened TPOT here)")
            continue
        few = v.get("n") is None or v["n"] < min_units(v["unit"])
        tail = f" (n = {v.get('n')} {v['unit']}, fewer than {min_units(v['unit'])}: decides nothing)" if few else ""
        lines.append(f"- {word}{tail}: {name}")
        if v.get("kind") == C8_PREFIX and v.get("tpot_too"):
            lines.append(f"  - the cache also shortened TPOT here (its gain's whole CI lies above "
                         f"{1 + v['delta']:.2f}): its gain is not confined to the first token.")
    return "\n".join(lines)


def measurements(runs: pd.DataFrame, summary: pd.DataFrame, quality: pd.DataFrame, plans: Mapping[str, StackPlan],
                 stacks: pd.DataFrame, waterfall: pd.DataFrame, interactions: pd.DataFrame, tput: pd.DataFrame,
                 tsum: pd.DataFrame, spec_gain: pd.DataFrame, alpha: Mapping, prefix_curve: pd.DataFrame,
                 sparse: pd.DataFrame, ppl: Mapping, checks: Mapping[str, dict], anchors: pd.DataFrame,
                 sparse_runs: pd.DataFrame | None = None) -> dict:
    """Everything the chapter measured, JSON-able (token ids and texts dropped). ``sparse`` is the
    per-context summary, ``sparse_runs`` the per-(prompt, context) rows it and C8's check come from."""
    return {
        "requests": runs.drop(columns=["tokens", "text"]), "latency": summary, "quality": quality,
        "plans": {wl: {"chain": [list(c) for c in p.chain], "notes": p.notes} for wl, p in plans.items()},
        "stacks": stacks, "waterfall": waterfall, "interactions": interactions,
        "throughput_runs": tput.drop(columns=["outputs"], errors="ignore"), "throughput": tsum, "spec_gain_vs_batch": spec_gain,
        "alpha": dict(alpha), "prefix_vs_output": prefix_curve, "sparse_vs_context": sparse, "perplexity": dict(ppl),
        "c8_checks": dict(checks), "anchors": anchors,
        "sparse_vs_context_per_prompt": sparse_runs if sparse_runs is not None else pd.DataFrame(),
    }
