"""Chapter 5's saturation numbers over whole runs: C5's throughput gains, C7's (read from here by chapter 7,
its forced stack included: continuous batching + radix cache + prompt lookup inside the batch), C8's
prefix-cache gains on TTFT and TPOT, and how much of prompt lookup's gain survives inside the batch.

Each whole run (``studylib.bench.whole_runs``) is a fresh process that loads the engine, builds the
chapter's requests and serves them once per arm, all queued at t = 0, the arms in an order that rotates
with the run. One-at-a-time serving takes a different ``1/runs`` share of the requests in each run
(request i in run i mod runs): requests served alone do not interact, so the share's tokens over its
time is the arm's throughput, and the runs together serve every request once (the cost of one pass).

Each run gives one number per gain (the arm's throughput over the baseline's, the TTFT and TPOT medians
without the cache over with it); the CIs are over runs (t on their logs), n = runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from studylib.bench.stats import rotated
from studylib.claims import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    MIN_UNITS,
    Verdict,
    decide_parts,
)
from studylib.experiments.ch05_batching import (
    CHAPTER,
    arm_name,
    base_arm,
    chapter_workload,
    parse_arm,
    serve,
    speculates,
)
from studylib.experiments.ch05_interplay import EQUIVALENCE_DELTA, TTFT_NOT_TPOT, band_state
from studylib.experiments.ch05_load import shared_prefix_workload

TREATED = ("continuous", "continuous+radix")
INTERACTION = "interaction:"  # + a batched arm that speculates: its lookup gain in the batch / alone
C8_BATCH = "speculation's gain shrinks inside the batch"  # C8@5's second part, from the INTERACTION metrics


def chapter_requests(tokenizer, n: int, workload: str, system_tokens: int, n_systems: int, seed: int,
                     max_new_tokens: int, min_new_tokens: int | None, salt: int = 0) -> list:
    """The chapter's mix: chat requests, each behind one of ``n_systems`` shared system prompts of
    ``system_tokens`` tokens (plain ``workload`` requests when ``system_tokens`` is 0)."""
    if system_tokens:
        return shared_prefix_workload(tokenizer, n, system_tokens, n_systems, seed + salt, max_new_tokens,
                                      min_new_tokens)
    return chapter_workload(tokenizer, n, max_new_tokens, min_new_tokens, workload, seed + salt)


def timing_run(model: str, weights: str, act: str, n_requests: int, workload: str, system_tokens: int,
               n_systems: int, seed: int, max_new_tokens: int, min_new_tokens: int | None, arms: Sequence[str],
               engine: Mapping, run_index: int = 0, run_count: int = 1, device: str = "cpu", dtype: str = "float32",
               **_) -> dict:
    """One whole run of the saturation comparison; returns this run's throughput per arm, each treated
    arm's (and each speculating arm's) gain over every other arm, the radix cache's TTFT and TPOT gains
    under continuous batching, and each batched lookup arm's interaction (``lookup_interactions``)."""
    from studylib.models import load_model

    lm, tok = load_model(model, device, dtype, weights=weights, act=act)
    items = chapter_requests(tok, n_requests, workload, system_tokens, n_systems, seed, max_new_tokens, min_new_tokens)
    parsed = [parse_arm(a) for a in arms]
    warm = [type(i)(i.id, min(2, i.max_new_tokens), i.prompt, i.messages, i.prompt_ids) for i in items[:4]]
    for sched, prefix, spec in parsed:  # first use of each code path pays one-off costs that belong to no arm
        serve(lm, tok, warm, sched, prefix, math.inf, seed, engine, spec)
    summaries = {}
    for sched, prefix, spec in rotated(parsed, run_index):
        share = list(items[run_index % run_count::run_count]) if sched == "sequential" else list(items)
        if not share:  # fewer requests than runs: this run's one-at-a-time share is empty
            continue
        _, run = serve(lm, tok, share, sched, prefix, math.inf, seed, engine, spec)
        summaries[arm_name(sched, prefix, spec)] = run.summary(None)
    out = {f"throughput:{a}": float(s["throughput_tok_s"]) for a, s in summaries.items()}
    for t in TREATED:
        for b in summaries:
            if t in summaries and b != t:
                out[f"gain:{t}/{b}"] = out[f"throughput:{t}"] / out[f"throughput:{b}"]
    for t in (a for a in summaries if speculates(a)):  # a lookup arm: over one-at-a-time serving and over itself
        for b in dict.fromkeys(("sequential", base_arm(t))):  # without the lookup
            if b in summaries:
                out[f"gain:{t}/{b}"] = out[f"throughput:{t}"] / out[f"throughput:{b}"]
    if {"continuous", "continuous+radix"} <= summaries.keys():
        plain, cached = summaries["continuous"], summaries["continuous+radix"]
        out["ttft_gain:continuous"] = float(plain["ttft_s"]["p50"] / cached["ttft_s"]["p50"])
        out["tpot_gain:continuous"] = float(plain["tpot_s"]["p50"] / cached["tpot_s"]["p50"])
    out.update(lookup_interactions(out))
    return out


def lookup_interactions(metrics: Mapping[str, float]) -> dict[str, float]:
    """Speculation inside the batch, as one run's numbers (C8's own example, "speculative gains shrink as
    the batch grows", measured rather than modelled). For each batched arm that speculates (e.g.
    ``continuous+radix+lookup:8,3``) and the one-at-a-time arm with the same lookup
    (``sequential+lookup:8,3``): the lookup's gain in the batch (its throughput over the same arm without
    the lookup) divided by its gain one request at a time, on this run's requests. Below 1: the batch took
    away part of what the lookup gave alone. Key ``interaction:<batched arm>``."""
    tput = {k.removeprefix("throughput:"): v for k, v in metrics.items() if k.startswith("throughput:")}
    out = {}
    for arm, value in tput.items():
        sched, prefix, spec = parse_arm(arm)
        alone = arm_name("sequential", "none", spec)
        if not spec or sched == "sequential" or alone not in tput or "sequential" not in tput:
            continue
        in_batch = value / tput[arm_name(sched, prefix)] if arm_name(sched, prefix) in tput else None
        if in_batch is not None:
            out[f"{INTERACTION}{arm}"] = in_batch / (tput[alone] / tput["sequential"])
    return out


def gains_over_runs(runs) -> pd.DataFrame:
    """Every gain the runs measured, with its CI over runs; the columns of
    ``ch05_batching.saturation_gains`` (its ``estimate`` column is the run-level estimate)."""
    rows = []
    for m in runs.metrics():
        if not m.startswith("gain:"):
            continue
        treated, _, baseline = m.removeprefix("gain:").partition("/")
        est = runs.estimate(m)
        rows.append({"treated": treated, "baseline": baseline, "gain": est.value, "ci_low": est.ci_low,
                     "ci_high": est.ci_high, "repeats": est.n, "estimate": est})
    return pd.DataFrame(rows, columns=["treated", "baseline", "gain", "ci_low", "ci_high", "repeats", "estimate"])


def throughput_table(runs) -> pd.DataFrame:
    """Per arm: its throughput in each run and their geometric mean."""
    rows = []
    for m in runs.metrics():
        if m.startswith("throughput:"):
            vals = runs.values(m)
            rows.append({"arm": m.removeprefix("throughput:"), "tokens_per_s": runs.estimate(m).value,
                         **{f"run {i}": v for i, v in enumerate(vals, 1)}})
    return pd.DataFrame(rows)


def _state(est, low: float, high: float) -> str:
    """Where a CI lies against the band [low, high]: "inside", "outside" (wholly out) or "straddles"."""
    if est is None or math.isnan(est.ci_low) or est.n < MIN_UNITS["whole runs"]:
        return "undecided"
    return band_state(est.ci_low, est.ci_high, low, high, est.mc_error)


def judge_c8(runs, conditions: str, delta: float = EQUIVALENCE_DELTA) -> list[Verdict]:
    """C8 from this chapter, on whole runs: the claim's own example, "prefix caching helps TTFT but not
    TPOT", as one row with three outcomes, so no arrangement of the two gains makes it hold by default:

    - **holds**: the TTFT gain's CI lies above 1 + delta AND the TPOT gain's CI lies inside the equivalence
      band [1 - delta, 1 + delta] (TOST at the CI's level);
    - **does not hold**: the TTFT gain's CI lies below 1 + delta, OR the TPOT gain's CI lies wholly outside
      the band (the cache changes decoding too: an interaction with batching, or a cost);
    - **inconclusive** (neither): any CI straddles its bound, or there are fewer than 5 runs."""
    from studylib.claims import ci_level
    from studylib.decisions import level

    # C8's family is its conditions in chapters 5 and 7 together: either clearing carries the study's line
    confidence, k = level("C8", CHAPTER)
    ttft = runs.estimate("ttft_gain:continuous", confidence) if "ttft_gain:continuous" in runs.metrics() else None
    tpot = runs.estimate("tpot_gain:continuous", confidence) if "tpot_gain:continuous" in runs.metrics() else None
    band = (1 - delta, 1 + delta)
    t_state = _state(ttft, 1 + delta, math.inf)
    p_state = _state(tpot, *band)
    if "undecided" in (t_state, p_state):
        verdict, why = INCONCLUSIVE, f"fewer than {MIN_UNITS['whole runs']} whole runs or no CI"
    elif t_state == "outside" or p_state == "outside":
        verdict = FAILS
        why = ("the TTFT gain's CI lies below the band" if t_state == "outside" else
               "the TPOT gain's CI lies wholly outside the equivalence band: the cache changes decoding too")
    elif t_state == "inside" and p_state == "inside":
        verdict, why = HOLDS, "TTFT gain above the band and TPOT gain inside it"
    else:
        verdict, why = INCONCLUSIVE, "neither: a CI straddles its bound"

    def cell(e) -> str:
        return "no CI" if e is None or math.isnan(e.ci_low) else f"{e.value:.3g}x [{e.ci_low:.3g}, {e.ci_high:.3g}]"

    n = min(e.n for e in (ttft, tpot) if e is not None) if ttft is not None and tpot is not None else 0
    nums = f"continuous batching at saturation: TTFT gain {cell(ttft)}, TPOT gain {cell(tpot)}, n={n} whole runs"
    note = (f"{conditions}; delta = {delta:g} (the study's choice); band [{band[0]:.2f}, {band[1]:.2f}]; {why}; "
            f"{ci_level(confidence)} CIs over whole runs (t on the log of the per-run gains), Bonferroni over C8's "
            f"{k} declared conditions in chapters 5 and 7")
    row = Verdict("C8", "", f"{TTFT_NOT_TPOT} ({nums})", tpot.value if tpot is not None else None,
                  (tpot.ci_low, tpot.ci_high) if tpot is not None else None,
                  "caching helps TTFT, not TPOT: the gain is local", verdict, note, CHAPTER, n=n or None,
                  direction="check", unit="whole runs", ci_method=tpot.method if tpot is not None else None,
                  confidence=confidence, tried=k,
                  # the error the band reading guarded with (the TPOT gain's: the CI the row shows)
                  mc_error=tpot.mc_error if tpot is not None else None)
    rows = [row, judge_batch(runs, conditions, confidence, k)]
    # the claimed text is the source's: methods accelerate locally. "Does not hold" therefore means a gain that
    # did not stay local (the cache's reached TPOT under batching), which is itself the interaction C8 asks
    # the study to show; the note says so, so the row does not read as "the gains compose".
    reading = ("does not hold here means a gain did not stay local: under batching the cache's gain reached TPOT "
               "too, an interaction between the techniques, which is what a global view has to account for")
    return decide_parts("C8", "measured interactions of the prefix cache and of speculation with batching", rows,
                        "each acceleration stays local (the cache's gain in TTFT only)",
                        f"{conditions}; {reading}" if conditions else reading, CHAPTER)



def batch_readings(runs, confidence: float = 0.95) -> list[dict]:
    """Per batched arm that speculates: the interaction's estimate over the runs at ``confidence`` and
    where its CI lies against 1 ("below", "above", "across"; bounds must clear 1 by their Monte Carlo
    error, as every bar), with n and the arm."""
    from studylib.verdict import guard

    out = []
    for m in (m for m in runs.metrics() if m.startswith(INTERACTION)):
        e = runs.estimate(m, confidence)
        state = ("below" if e.ci_high + guard(e.mc_error) < 1 else "above" if e.ci_low - guard(e.mc_error) > 1
                 else "across")
        out.append({"arm": m.removeprefix(INTERACTION), "estimate": e, "state": state})
    return out


def judge_batch(runs, conditions: str, confidence: float, tried: int) -> Verdict:
    """C8's second example, "speculative gains shrink as the batch grows", measured: prompt lookup's gain
    inside the continuous batch over its gain one request at a time (``lookup_interactions``), per whole
    run. Holds when the CI lies below 1, does not hold when it lies wholly above 1, inconclusive across 1,
    with fewer than 5 runs, or when no arm speculated in the batch (a declared part left unmeasured)."""
    from studylib.claims import ci_level

    readings = batch_readings(runs, confidence)
    if not readings:
        return Verdict("C8", "", f"{C8_BATCH}: not measured (no arm served prompt lookup inside the batch beside the "
                       "same lookup one request at a time)", None, None, "speculative gains shrink as the batch grows",
                       INCONCLUSIVE, conditions, CHAPTER, direction="check", unit="whole runs", confidence=confidence,
                       tried=tried)
    r = readings[0]  # the one declared forced-stack arm; further lookup arms are shown by lookup_text
    e = r["estimate"]
    if e.n < MIN_UNITS["whole runs"] or math.isnan(e.ci_low):
        verdict, why = INCONCLUSIVE, f"fewer than {MIN_UNITS['whole runs']} whole runs or no CI"
    else:
        verdict, why = {"below": (HOLDS, "the lookup's gain inside the batch is below its gain alone"),
                        "above": (FAILS, "the lookup gained more inside the batch than alone"),
                        "across": (INCONCLUSIVE, "neither: the CI crosses 1")}[r["state"]]
    sched, prefix, spec = parse_arm(r["arm"])
    nums = (f"prompt lookup's throughput gain inside the {arm_name(sched, prefix).replace('+', ' + ')} batch / its "
            f"gain one request at a time: {e.value:.3g} [{e.ci_low:.3g}, {e.ci_high:.3g}], n={e.n} whole runs")
    note = (f"{conditions}; arm {r['arm']} beside {arm_name('sequential', 'none', spec)} on the same requests; {why}; "
            f"{ci_level(confidence)} CIs over whole runs (t on the log of the per-run ratios), Bonferroni over C8's "
            f"{tried} declared conditions in chapters 5 and 7")
    return Verdict("C8", "", f"{C8_BATCH} ({nums})", e.value, (e.ci_low, e.ci_high),
                   "speculative gains shrink as the batch grows", verdict, note, CHAPTER, n=e.n, direction="check",
                   unit="whole runs", ci_method=e.method, confidence=confidence, tried=tried, mc_error=e.mc_error)


def c8_text(runs, delta: float = EQUIVALENCE_DELTA) -> str:
    """What the prefix cache did to TTFT and TPOT at saturation over the whole runs, in words, from the
    same numbers the C8 row judges."""
    if "ttft_gain:continuous" not in runs.metrics():
        return "The whole runs did not serve both continuous arms, so the cache's effect on TTFT and TPOT is not measured."
    from studylib.claims import ci_level
    from studylib.decisions import level

    confidence = level("C8", CHAPTER)[0]  # the level the C8 row judges at
    ttft = runs.estimate("ttft_gain:continuous", confidence)
    tpot = runs.estimate("tpot_gain:continuous", confidence)
    band = (1 - delta, 1 + delta)
    head = (f"Over {ttft.n} whole runs at saturation under continuous batching, the radix prefix cache's gain "
            f"(median without / median with the cache, per run) is {ttft.value:.2f}x [{ttft.ci_low:.2f}, "
            f"{ttft.ci_high:.2f}] on TTFT and {tpot.value:.2f}x [{tpot.ci_low:.2f}, {tpot.ci_high:.2f}] on TPOT "
            f"({ci_level(confidence)} CIs over runs). ")
    p = _state(tpot, *band)
    if p == "inside":
        tail = f"TPOT is unchanged within the equivalence band [{band[0]:.2f}, {band[1]:.2f}]"
    elif p == "outside" and tpot.ci_low > band[1]:
        tail = ("The cache also shortens TPOT: under continuous batching prefills share forward passes with running "
                "decodes, so the prefill tokens the cache removes also shorten the steps decoding requests wait on")
    elif p == "outside":
        tail = f"TPOT got longer with the cache: its whole CI lies below {band[0]:.2f}"
    else:
        tail = (f"The TPOT gain's CI crosses an edge of the band [{band[0]:.2f}, {band[1]:.2f}], so whether the cache "
                "touches decoding is not decided")
    t = _state(ttft, 1 + delta, math.inf)
    ttft_words = {"inside": f"; the TTFT gain's whole CI lies above {1 + delta:.2f}.",
                  "outside": f"; the TTFT gain's whole CI lies below {1 + delta:.2f}.",
                  "straddles": f"; the TTFT gain's CI reaches {1 + delta:.2f}.", "undecided": "."}[t]
    return head + tail + ttft_words


def lookup_text(runs) -> str:
    """What prompt lookup inside the batch did at saturation over the whole runs, in words: the lookup's
    throughput gain one request at a time, the same lookup's gain inside the batch, and their ratio (the
    ``interaction:`` metric the C8 row judges), the gains with 95% CIs over runs, the ratio at C8's corrected
    level, so it prints the interval the row prints."""
    from studylib.claims import ci_level
    from studylib.decisions import level

    metrics = runs.metrics()
    arms = [m.removeprefix(INTERACTION) for m in metrics if m.startswith(INTERACTION)]
    if not arms:
        return ("No arm speculated inside the batch in these whole runs (an arm such as "
                "continuous+radix+lookup:8,3 beside sequential+lookup:8,3 measures it), so how prompt lookup's gain "
                "changes with batching is not measured here.")
    out = []
    for arm in arms:
        sched, prefix, spec = parse_arm(arm)
        alone, base = arm_name("sequential", "none", spec), arm_name(sched, prefix)
        a = runs.estimate(f"gain:{alone}/sequential")
        b = runs.estimate(f"gain:{arm}/{base}")
        c8_level = level("C8", CHAPTER)[0]
        i = runs.estimate(f"{INTERACTION}{arm}", c8_level)
        where = ("below 1: the batch took away part of the lookup's gain. A batched step already fills the rows that "
                 "verification used for free one request at a time, so each drafted token now costs its share of a "
                 "step" if i.ci_high < 1 else
                 "above 1: the lookup gained more inside the batch than alone" if i.ci_low > 1 else
                 "across 1: whether the batch changes the lookup's gain is not decided")
        out.append(f"Prompt lookup ({spec.partition(':')[2].replace(',', ' tokens, n-gram ')}) one request at a time "
                   f"gives {a.value:.2f}x [{a.ci_low:.2f}, {a.ci_high:.2f}] the throughput of plain one-at-a-time "
                   f"serving; inside the {base.replace('+', ' + ')} batch it gives {b.value:.2f}x [{b.ci_low:.2f}, "
                   f"{b.ci_high:.2f}] (95% CIs over {i.n} whole runs). Their ratio, per run, is {i.value:.2f} "
                   f"[{i.ci_low:.2f}, {i.ci_high:.2f}] ({ci_level(c8_level)} CI, C8's corrected level: the C8 row "
                   f"above judges it), {where}. Chapter 7 judges the forced stack's throughput for C7.")
    return " ".join(out)
