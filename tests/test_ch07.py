"""Chapter 7's pure logic on synthetic numbers (stack planning, waterfall, interaction, quality, verdicts),
plus one tiny-model run of the latency loop."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from studylib.claims import CONDITIONAL, FAILS, HOLDS, INCONCLUSIVE
from studylib.errors import StudylibError
from studylib.experiments import ch07_combined as cc
from studylib.experiments import ch07_quality as cq
from studylib.experiments import ch07_report as report
from studylib.experiments import ch07_stack as stk
from studylib.experiments import ch07_system as sys7

OPTS = {"prompt-lookup": {"gamma": 4}, "speculative": {"draft": "self:exit:1"}, "lookahead": {}}
ATT = "sinks:4,12"


def always(_techs):
    return None


# ------------------------------------------------------------------------------------ plan_stack


def test_plan_stack_takes_every_helpful_composable_technique_in_order():
    speed = {cc.PREFIX: 2.0, "prompt-lookup": 1.5, "speculative": 1.8, "lookahead": 0.9, cc.WINDOW: 1.1}
    plan = stk.plan_stack(speed, window_quality_ok=True, composable=always)
    assert plan.chain == [(cc.PREFIX,), (cc.PREFIX, "speculative"), (cc.PREFIX, "speculative", cc.WINDOW)]
    assert any("lookahead left out" in n for n in plan.notes)


def test_plan_stack_drops_window_below_the_quality_bar():
    speed = {cc.PREFIX: 2.0, "prompt-lookup": 1.5, cc.WINDOW: 3.0}
    plan = stk.plan_stack(speed, window_quality_ok=False, composable=always)
    assert plan.stack == (cc.PREFIX, "prompt-lookup")
    assert any("quality bar" in n for n in plan.notes)


def test_plan_stack_falls_back_to_next_decoder_that_composes():
    speed = {cc.PREFIX: 3.0, "prompt-lookup": 2.0, "speculative": 1.2}

    def composable(techs):
        return "no prefix_store" if "prompt-lookup" in techs and cc.PREFIX in techs else None

    plan = stk.plan_stack(speed, window_quality_ok=True, composable=composable)
    assert plan.stack == (cc.PREFIX, "speculative")
    assert any("prompt-lookup cannot stack" in n for n in plan.notes)


def test_plan_stack_keeps_faster_decoder_alone_when_it_cannot_compose():
    speed = {cc.PREFIX: 1.2, "prompt-lookup": 2.0}
    plan = stk.plan_stack(speed, True, lambda techs: "no" if len(techs) > 1 else None)
    assert plan.chain == [("prompt-lookup",)]


def test_plans_text_names_every_workload_and_reason():
    plans = {"a": stk.plan_stack({cc.PREFIX: 2.0, "speculative": 0.5}, True, always),
             "b": stk.plan_stack({cc.PREFIX: 0.5}, True, always)}
    text = stk.plans_text(plans, OPTS, ATT)
    assert "**a**: prefix cache." in text and "speculative left out: 0.50x" in text
    assert "**b**: nothing." in text


def test_a_technique_whose_ci_reaches_1_does_not_join():
    """Prompt lookup at 1.05x [0.82, 1.43] is no sure gain: the stack keeps the prefix cache alone."""
    plan = stk.plan_stack({cc.PREFIX: (2.0, 1.6, 2.4), "prompt-lookup": (1.05, 0.82, 1.43)}, True, always)
    assert plan.stack == (cc.PREFIX,)
    assert any("prompt-lookup left out" in n and "0.82-1.43" in n for n in plan.notes)


def test_plan_stack_with_nothing_helping_is_the_baseline():
    plan = stk.plan_stack({cc.PREFIX: 0.9, "speculative": 0.5}, True, always)
    assert plan.chain == [] and plan.stack == ()
    assert stk.stack_arm_name(plan, OPTS, ATT) == cc.BASELINE


# ------------------------------------------------------------------------- synthetic runs


def fake_runs(times: dict[str, list[float]], workload: str = "w", ttft: dict | None = None) -> pd.DataFrame:
    rows = []
    for arm, ts in times.items():
        techs = () if arm == cc.BASELINE else tuple(arm.split(" + "))
        for i, t in enumerate(ts):
            rows.append({"workload": workload, "request": f"r{i}", "order": i, "arm": arm, "techniques": techs,
                         "lossless": True, "attention": "dense", "prompt_tokens": 100, "new_tokens": 10,
                         "hit_tokens": 0, "ttft_s": (ttft or {}).get(arm, [0.1 * t] * len(ts))[i], "e2e_s": t,
                         "tpot_s": 0.9 * t / 9, "tokens_per_forward": 1.0, "tokens": [1, 2, 3], "text": "",
                         "alpha": None, "cost_ratio": None})
    return pd.DataFrame(rows)


def test_waterfall_factors_multiply_to_the_stack_speedup():
    base = [4.0, 6.0, 5.0, 7.0]
    runs = fake_runs({cc.BASELINE: base, cc.PREFIX: [2.0, 4.0, 3.0, 3.5],
                      f"{cc.PREFIX} + prompt-lookup": [1.0, 2.5, 1.5, 2.0]})
    plan = stk.StackPlan([(cc.PREFIX,), (cc.PREFIX, "prompt-lookup")], [])
    wf = stk.waterfall_frame(runs, {"w": plan}, OPTS, ATT)
    assert list(wf.added) == [cc.PREFIX, "prompt-lookup"]
    total = np.median(base) / np.median([1.0, 2.5, 1.5, 2.0])
    assert math.isclose(float(np.prod(wf.factor)), total) and math.isclose(wf.cumulative.iloc[-1], total)
    summary = cc.latency_summary(runs)
    row = summary[summary.arm == f"{cc.PREFIX} + prompt-lookup"].iloc[0]
    assert math.isclose(row.speedup, total) and row.exact_match == 1.0


def test_interaction_is_one_when_gains_multiply_and_below_one_when_they_overlap():
    base = np.array([4.0, 6.0, 5.0, 8.0, 7.0])
    a, b = base / 2, base / 3
    runs = fake_runs({cc.BASELINE: base.tolist(), "A": a.tolist(), "B": b.tolist(), "A + B": (base / 6).tolist()})
    est = stk.interaction(runs, "w", "A + B", ["A", "B"])
    assert math.isclose(est["value"], 1.0) and est["ci_low"] <= 1.0 <= est["ci_high"]
    runs = fake_runs({cc.BASELINE: base.tolist(), "A": a.tolist(), "B": b.tolist(), "A + B": (base / 3).tolist()})
    est = stk.interaction(runs, "w", "A + B", ["A", "B"])
    assert est["value"] == pytest.approx(0.5) and est["ci_high"] < 1.0


def test_prefix_gain_fades_with_output_length():
    runs = fake_runs({cc.BASELINE: [1.0, 1.2, 1.1], cc.PREFIX: [1.0, 1.2, 1.1]},
                     ttft={cc.BASELINE: [1.0, 1.2, 1.1], cc.PREFIX: [0.1, 0.12, 0.11]})
    runs["tpot_s"] = 0.05
    curve = sys7.prefix_vs_output(runs, "w", [1, 16, 1024])
    assert curve.speedup.iloc[0] == pytest.approx(10.0)
    assert curve.speedup.is_monotonic_decreasing and curve.speedup.iloc[-1] < 1.1


# --------------------------------------------------------------------------------- quality


def test_agreement_counts_positions_over_the_longer_output():
    assert cc.agreement([1, 2, 3], [1, 2, 3]) == 1.0
    assert cc.agreement([1, 2, 3, 4], [1, 9, 3]) == 0.5
    assert cc.agreement([], []) == 1.0


def test_retained_uses_exact_match_for_lossless_and_the_worst_measure_otherwise():
    assert cq.retained(True, 0.75, 0.9, 0.5, 2.0) == (0.75, "exact match")
    assert cq.retained(False, 0.0, 0.95, 0.9, 1.01) == (0.9, "task score ratio")
    v, key = cq.retained(False, 0.0, 0.99, float("nan"), 1.25)
    assert key == "1 / perplexity ratio" and v == pytest.approx(0.8)
    assert cq.retained(False, 0.0, 0.6, None, None) == (0.6, "greedy agreement")


def test_perplexity_counts_only_where_contexts_outgrow_the_window():
    ppl = {ATT: {"ppl_ratio": 1.25, "ppl_ratio_low": 1.2, "ppl_ratio_high": 1.3}}
    empty = pd.DataFrame(columns=["workload", "request", "arm", "metric", "score"])
    for prompt, expect in ((100, 0.8), (8, 1.0)):  # budget 4 + 12 = 16 keys
        runs = fake_runs({cc.BASELINE: [1.0, 1.0], "w": [1.0, 1.0]})
        runs.loc[runs.arm == "w", ["lossless", "attention"]] = [False, ATT]
        runs["prompt_tokens"] = prompt
        runs["new_tokens"] = 3
        q = cq.quality_frame(runs, empty, ppl).set_index("arm").loc["w"]
        assert q.quality_retained == pytest.approx(expect) and q.agreement == 1.0


def test_task_ratio_is_undefined_when_the_baseline_scores_zero():
    scores = pd.DataFrame({"workload": ["xsum"] * 4, "request": ["a", "b", "a", "b"],
                           "arm": ["ar", "ar", "x", "x"], "metric": "ROUGE-L F1", "score": [0.0, 0.0, 0.1, 0.0]})
    assert math.isnan(cq.task_ratio(scores, "xsum", "x")[2])
    scores["score"] = [0.4, 0.2, 0.3, 0.3]
    assert cq.task_ratio(scores, "xsum", "x")[2] == pytest.approx(1.0)


# --------------------------------------------------------------------------------- verdicts


def stacks_frame(speedups, lows, highs, quality=1.0, requests=10):
    return pd.DataFrame({"workload": [f"w{i}" for i in range(len(speedups))], "stack": "s", "requests": requests,
                         "speedup": speedups, "low": lows, "high": highs, "ttft_speedup": 1.0, "tpot_speedup": 1.0,
                         "quality": quality, "q_low": quality, "q_high": quality, "binding": "exact match"})


def latency_runs(values, n=5, spread=0.02):
    """Whole runs as ``ch07_runs.latency_run`` returns them: one speed-up per workload per run."""
    import numpy as np

    from studylib.bench.whole_runs import WholeRuns

    rng = np.random.default_rng(3)
    return WholeRuns("studylib.experiments.ch07_runs:latency_run", {}, [{"metrics": {f"latency:w{i}": v * (1 + spread * rng.standard_normal())
                                              for i, v in enumerate(values)}} for _ in range(n)])


def test_latency_verdict_is_over_whole_runs_per_workload_corrected():
    from studylib import decisions

    holds = report.judge_latency(stacks_frame([15, 18], [14, 16], [16, 20]), "c", latency_runs([15, 18]))
    confidence, k = report.latency_confidence()
    assert holds.verdict == HOLDS and holds.unit == "whole runs" and holds.n == 5
    assert k == 5 and holds.tried == k and holds.confidence == pytest.approx(confidence)
    v = report.judge_latency(stacks_frame([15, 2], [14, 1.5], [16, 2.5]), "c", latency_runs([15, 2]))
    assert v.verdict == CONDITIONAL and "w0" in v.conditions and "w1" in v.conditions
    assert report.judge_latency(stacks_frame([1.2, 2], [1.1, 1.5], [1.3, 2.5]), "c",
                                latency_runs([1.2, 2])).verdict == FAILS
    # two whole runs cannot decide; nor can the confirmation run's requests, inside one process
    assert report.judge_latency(stacks_frame([12], [11], [13]), "c", latency_runs([12], n=2)).verdict == INCONCLUSIVE
    assert report.judge_latency(stacks_frame([12], [11], [13]), "c").verdict == INCONCLUSIVE
    # a workload the runs did not measure stays a condition without a CI
    gap = report.judge_latency(stacks_frame([15, 18], [14, 16], [16, 20]), "c", latency_runs([15]))
    assert gap.verdict == CONDITIONAL
    assert len(decisions.stamp([holds, v], 7)) == 2  # judged as C7@7 declares it


def test_a_workload_whose_stack_is_ar_is_not_a_latency_unit():
    """AR timed against itself reads 1.0 whatever the machine does: it is named, never a condition; with
    no other stack anywhere the part fails (the search found nothing faster than AR)."""
    st = stacks_frame([15, 1.0], [14, 1.0], [16, 1.0])
    st.loc[1, "stack"] = cc.BASELINE
    v = report.judge_latency(st, "c", latency_runs([15, 1.0]))
    assert v.verdict == HOLDS and "AR timed against itself: w1" in v.conditions
    every = st.assign(stack=cc.BASELINE)
    v = report.judge_latency(every, "c", latency_runs([1.0, 1.0]))
    assert v.verdict == FAILS and not v.by_construction


def test_latency_run_reads_ar_stacks_as_one_by_definition():
    from studylib.experiments import ch07_runs

    out = ch07_runs.latency_run("smollm2-135m", "dense", "fp32", {"chat": [], "xsum": []}, 2, 4, 64, 1, 2, 1500, 0,
                                "auto", None, 4, 8, 3, "lookahead:5,4,5", "sinks:4,252")
    assert out == {"latency:chat": 1.0, "latency:xsum": 1.0}


def test_a_lossless_stack_is_an_exactness_check_not_a_degenerate_ci():
    [ok] = report.judge_quality(stacks_frame([1.0], [1.0], [1.0], quality=1.0), "c")
    assert ok.verdict == HOLDS and ok.ci is None and ok.n == 10 and "identical" in ok.metric
    # one mismatched request of ten fails it: exactness has no tolerance
    [bad] = report.judge_quality(stacks_frame([1.0], [1.0], [1.0], quality=0.9), "c")
    assert bad.verdict == FAILS
    # too few requests to call it exact
    [few] = report.judge_quality(stacks_frame([1.0], [1.0], [1.0], quality=1.0, requests=4), "c")
    assert few.verdict == INCONCLUSIVE


def test_a_lossy_stack_is_judged_on_its_ci_beside_the_lossless_ones():
    st = stacks_frame([1.0, 1.0], [1.0, 1.0], [1.0, 1.0], quality=1.0)
    st.loc[1, ["quality", "q_low", "q_high", "binding"]] = [0.95, 0.93, 0.97, "greedy agreement"]
    exact, lossy = report.judge_quality(st, "c")
    assert exact.verdict == HOLDS and exact.n == 10
    assert lossy.verdict == FAILS and "lossy" in lossy.metric


def test_throughput_verdict_and_the_range_note():
    tsum = pd.DataFrame({"policy": ["continuous + radix"], "gain": [20.0], "gain_low": [18.0], "gain_high": [22.0],
                         "repeats": [5], "method": ["t on the log of the per-run medians (4 df)"]})
    v = report.judge_throughput(tsum, "c")
    assert v.verdict == HOLDS and "above the claimed" in v.conditions and v.n == 5
    # the same numbers from replays in one process count no repeats
    replays = tsum.assign(method=["BCa bootstrap, 10,000 resamples"])
    assert report.judge_throughput(replays, "c").verdict == INCONCLUSIVE
    tsum["gain"], tsum["gain_low"], tsum["gain_high"] = 3.0, 2.5, 3.5
    assert report.judge_throughput(tsum, "c").verdict == FAILS
    tsum["repeats"] = 2
    assert report.judge_throughput(tsum, "c").verdict == INCONCLUSIVE


def test_a_stack_that_is_ar_itself_is_not_counted_for_quality():
    from studylib import decisions

    st = stacks_frame([1.0], [1.0], [1.0], quality=1.0).assign(stack=cc.BASELINE)
    [q] = report.judge_quality(st, "c")
    assert q.by_construction and "AR itself" in q.metric
    assert len(decisions.stamp([q], 7)) == 1
    assert not any(r.by_construction for r in report.judge_quality(stacks_frame([1.6], [1.0], [3.9]), "c"))


def test_c7_is_one_decision_a_lossless_stack_cannot_carry():
    tsum = pd.DataFrame({"policy": ["continuous + radix"], "gain": [2.6], "gain_low": [2.5], "gain_high": [2.7],
                         "repeats": [5]})
    rows = report.judge_c7(stacks_frame([1.6], [1.0], [3.9]), tsum, "c", "s", latency_runs=latency_runs([1.6]))
    assert [r.role for r in rows] == ["decision", "part", "part", "part"]
    assert rows[1].verdict == HOLDS  # quality holds: the stack is lossless ...
    assert rows[0].verdict == FAILS  # ... but the claim is the three parts at once


def c8_inputs(tpot=(1.0, 0.98, 1.02), stack=(0.6, 0.5, 0.7), growth=1.8, prompts=10, requests=10):
    spec = pd.DataFrame({"batch": [1, 16], "gain": [1.5, 0.8]})
    prefix = pd.Series({"workload": "w", "ttft_speedup": 5.0, "ttft_low": 4.0, "ttft_high": 6.0,
                        "tpot_speedup": tpot[0], "tpot_low": tpot[1], "tpot_high": tpot[2], "requests": requests})
    rows = []
    for p in range(prompts):  # per prompt: speed-up at the shortest and at the longest context
        jitter = 1 + 0.01 * ((p % 5) - 2)
        for ctx, gain in ((256, 0.9), (1024, 0.9 * (1 + growth) / 2), (2048, 0.9 * growth)):
            g = gain * jitter if ctx != 256 else gain
            rows.append({"prompt": p, "context": ctx, "dense_ms": 10.0 * g, "sparse_ms": 10.0, "speedup": g,
                         "steps": 4})
    sparse = pd.DataFrame(rows)
    inter = pd.DataFrame({"workload": ["w"], "stack": ["s"], "ratio": [stack[0]], "low": [stack[1]],
                          "high": [stack[2]], "requests": [requests], "confidence": [0.95]})
    return spec, prefix, sparse, inter


def growth_runs(growth=1.8, at_long=1.6, n=5, spread=0.01):
    from studylib.bench.whole_runs import WholeRuns
    from studylib.experiments import ch07_runs

    rng = np.random.default_rng(5)
    return WholeRuns("studylib.experiments.ch07_runs:latency_run", {}, [{"metrics": {ch07_runs.GROWTH: growth * (1 + spread * rng.standard_normal()),
                                              ch07_runs.GAIN_LONG: at_long * (1 + spread * rng.standard_normal())}}
                                 for _ in range(n)])


def c8_rows(runs=None, **kw):
    return report.judge_c8(report.c8_checks(*c8_inputs(**kw), growth_runs=runs or growth_runs()), "c")


def row(rows, prefix):
    return next(r for r in rows if r.metric.startswith(prefix))


def test_c8_at_7_decides_on_the_sparse_growth_over_whole_runs_and_shows_the_rest():
    """Chapter 7's prefix and stacking readings are speed-ups over requests in one process: shown, never
    deciding; the sparse growth decides over whole runs."""
    from studylib import decisions

    checks = report.c8_checks(*c8_inputs(), growth_runs=growth_runs())
    assert len(checks) == 5 and sum(c["measured"] for c in checks.values()) == 1
    assert {c["kind"] for c in checks.values() if c.get("shown")} == {report.C8_PREFIX, report.C8_STACK}
    rows = report.judge_c8(checks, "c")
    assert rows[0].verdict == HOLDS and len(rows) == 2 and "not counted (models)" in rows[0].conditions
    assert "shown, not deciding" in rows[0].conditions and report.C8_PREFIX in rows[0].conditions
    assert (rows[1].unit, rows[1].n) == ("whole runs", 5) and rows[1].metric.startswith(report.C8_SPARSE)
    assert rows[1].tried == 2 and rows[1].confidence == pytest.approx(0.975)
    spec, prefix, sparse, inter = c8_inputs()
    spec["gain"] = [0.8, 1.5]  # the model's check fails: it changes nothing
    assert report.judge_c8(report.c8_checks(spec, prefix, sparse, inter, growth_runs=growth_runs()),
                           "c")[0].verdict == HOLDS
    # the shown rows change nothing either way
    assert c8_rows(tpot=(1.8, 1.7, 1.9), stack=(1.4, 1.2, 1.6))[0].verdict == HOLDS
    for kw in ({}, {"tpot": (1.8, 1.7, 1.9)}, {"stack": (1.4, 1.2, 1.6)}, {"growth": 1.0}):
        decisions.stamp(c8_rows(**kw), 7)  # raises if a row is not what C8@7 declares
    decisions.stamp(c8_rows(runs=growth_runs(growth=1.0, at_long=0.9)), 7)


def test_sparse_growth_is_judged_over_whole_runs():
    assert row(c8_rows(), report.C8_SPARSE).verdict == HOLDS
    assert row(c8_rows(runs=growth_runs(growth=0.9)), report.C8_SPARSE).verdict == FAILS
    # a loss that shrinks grows, but is no gain at the long context
    assert row(c8_rows(runs=growth_runs(growth=1.8, at_long=0.8)), report.C8_SPARSE).verdict == FAILS
    # fewer than 5 whole runs decide nothing, whichever way they went
    assert row(c8_rows(runs=growth_runs(n=3)), report.C8_SPARSE).verdict == INCONCLUSIVE
    assert row(c8_rows(runs=growth_runs(growth=0.9, n=3)), report.C8_SPARSE).verdict == INCONCLUSIVE
    # without whole runs the in-process reading counts no units
    no_runs = report.judge_c8(report.c8_checks(*c8_inputs()), "c")
    assert row(no_runs, report.C8_SPARSE).verdict == INCONCLUSIVE and "no whole runs" in no_runs[1].metric
    g = sys7.sparse_growth(c8_inputs(growth=1.8)[2])
    assert g["n"] == 10 and g["ci_low"] > 1 and (g["shortest"], g["longest"]) == (256, 2048)


def batch_runs(ratio=0.7, n=5, spread=0.01, arm="continuous+radix+lookup:8,3"):
    """Chapter 5's whole runs with the forced stack: throughputs whose lookup interaction is ``ratio``."""
    from studylib.bench.whole_runs import WholeRuns
    from studylib.experiments import ch05_runs

    rng = np.random.default_rng(7)
    runs = []
    for _ in range(n):
        t = {"sequential": 10.0, "sequential+lookup:8,3": 12.0 * (1 + spread * rng.standard_normal()),
             "continuous+radix": 40.0}
        t[arm] = 40.0 * 1.2 * ratio * (1 + spread * rng.standard_normal())
        m = {f"throughput:{a}": v for a, v in t.items()}
        m.update({f"gain:{arm}/continuous+radix": t[arm] / 40.0, **ch05_runs.lookup_interactions(m)})
        runs.append({"metrics": m})
    return WholeRuns("studylib.experiments.ch05_runs:timing_run", {}, runs)


def test_chapter_7_shows_speculation_inside_the_batch_which_chapter_5_decides():
    """The forced stack's C8 reading is chapter 5's (C8@5 over its whole runs): chapter 7 lists it as shown,
    never as a row of its own, and says when chapter 5 did not measure it."""
    from studylib import decisions

    checks = report.c8_checks(*c8_inputs(), growth_runs=growth_runs(), batch_runs=batch_runs(0.7))
    batch = [v for v in checks.values() if v["kind"] == report.C8_BATCH]
    assert len(batch) == 1 and batch[0]["shown"] and not batch[0]["measured"] and batch[0]["passed"]
    assert not [v for v in checks.values() if v["kind"] == report.C8_BATCH and v["measured"]]
    rows = report.judge_c8(checks, "c")
    decisions.stamp(rows, 7)
    assert not any(r.metric.startswith(report.C8_BATCH) for r in rows) and report.C8_BATCH in rows[0].conditions
    grew = report.c8_checks(*c8_inputs(), growth_runs=growth_runs(), batch_runs=batch_runs(1.4))
    assert not next(v for v in grew.values() if v["kind"] == report.C8_BATCH)["passed"]
    checks = report.c8_checks(*c8_inputs(), growth_runs=growth_runs(), batch_runs=None)
    assert any(k.startswith(f"{report.C8_BATCH}: not measured") for k in checks)


def test_the_forced_stack_is_a_throughput_part_of_its_own():
    from studylib import decisions

    tsum = pd.DataFrame({"policy": ["continuous + radix", sys7.FORCED_POLICY], "gain": [9.0, 3.0],
                         "gain_low": [8.5, 2.8], "gain_high": [9.5, 3.2], "repeats": [5, 5],
                         "throughput_tok_s": [90.0, 30.0], "arm": ["continuous+radix", "continuous+radix+lookup:8,3"],
                         "method": ["t on the log of the per-run medians (4 df)"] * 2})
    rows = report.judge_c7(stacks_frame([1.6], [1.0], [3.9]), tsum, "c", "s", latency_runs=latency_runs([1.6]))
    forced = [r for r in rows if r.metric == report.FORCED_METRIC]
    assert len(forced) == 1 and forced[0].verdict == FAILS and forced[0].role == "part"
    assert row(rows, "throughput at saturation vs AR one at a time (x)").verdict == HOLDS
    decisions.stamp(rows, 7)
    text = report.forced_text(tsum, batch_runs(0.7))
    assert "3.00x [2.80, 3.20]" in text and "costs throughput" in text
    frame = sys7.forced_stack_frame(tsum)
    assert list(frame["stack"]) == ["continuous + radix", sys7.FORCED_POLICY]
    assert "not served" in report.forced_text(tsum.iloc[:1])


def test_chapter_5s_arm_names_read_as_chapter_7s_policies():
    assert sys7.policy_name("continuous+radix") == sys7.BEST_POLICY
    assert sys7.policy_name("continuous+radix+lookup:8,3") == sys7.FORCED_POLICY
    assert sys7.policy_name("sequential+lookup:4,2") == "sequential + prompt lookup"
    assert sys7.policy_name("static") == "static"


def test_a_declared_stacking_check_with_nothing_to_compare_is_named_not_dropped():
    spec, prefix, sparse, inter = c8_inputs()
    checks = report.c8_checks(spec, prefix, sparse, inter.iloc[0:0], growth_runs=growth_runs(),
                              batch_runs=batch_runs())
    gone = [k for k, v in checks.items() if v.get("kind") == "unmeasured"]
    assert len(gone) == 1 and gone[0].startswith(report.C8_STACK) and "not measured" in gone[0]
    rows = report.judge_c8(checks, "c")
    assert f"{report.C8_STACK}: not measured" in rows[0].conditions
    assert f"- {report.C8_STACK}: not measured" in report.checks_text(checks)


def test_the_shown_prefix_reading_uses_the_one_declared_band():
    from studylib.experiments.ch05_interplay import EQUIVALENCE_DELTA

    checks = report.c8_checks(*c8_inputs(tpot=(1.0, 0.93, 1.07)), growth_runs=growth_runs())
    prefix = next(v for v in checks.values() if v["kind"] == report.C8_PREFIX)
    assert prefix["delta"] == EQUIVALENCE_DELTA and prefix["passed"]
    checks = report.c8_checks(*c8_inputs(tpot=(1.8, 1.7, 1.9)), growth_runs=growth_runs())
    assert "also shortened TPOT" in report.checks_text(checks)
    assert "shown, not deciding" in report.checks_text(checks)


def test_interaction_ci_widens_with_the_corrected_confidence():
    base = np.array([4.0, 6.0, 5.0, 8.0, 7.0, 5.5, 6.5, 4.5, 7.5, 6.0])
    noise = np.array([1.0, 1.1, 0.9, 1.05, 0.95, 1.02, 0.98, 1.08, 0.92, 1.0])
    runs = fake_runs({cc.BASELINE: base.tolist(), "A": (base / 2).tolist(), "B": (base / 3 * noise).tolist(),
                      "A + B": (base / 4 * noise[::-1]).tolist()})
    e95 = stk.interaction(runs, "w", "A + B", ["A", "B"])
    e99 = stk.interaction(runs, "w", "A + B", ["A", "B"], confidence=0.99)
    assert e99["ci_low"] <= e95["ci_low"] and e95["ci_high"] <= e99["ci_high"]
    one = stk.interaction(fake_runs({cc.BASELINE: [4.0], "A": [2.0], "B": [2.0], "A + B": [1.0]}), "w", "A + B",
                          ["A", "B"])
    assert math.isnan(one["ci_low"])  # one request: no CI


def test_sparse_vs_context_measures_every_prompt_at_every_context(tiny):
    model, _ = tiny
    per = sys7.sparse_vs_context(model, ATT, [8, 16], steps=1, prompts=2, progress=False)
    assert len(per) == 4 and set(per.prompt) == {0, 1} and set(per.context) == {8, 16}
    summary = sys7.sparse_summary(per)
    assert list(summary.context) == [8, 16] and (summary.prompts == 2).all()
    assert sys7.sparse_growth(per)["n"] == 2


# ------------------------------------------------------------------------- reports and anchors


def test_chapter_json_is_found_from_the_runner_staging_folder(tmp_path):
    (tmp_path / "ch05.json").write_text(json.dumps({"measurements": {"step_curve": [
        {"batch": b, "tokens_per_seq": k, "step_s": 0.01 * b * (1 + (k > 1))} for b in (1, 4) for k in (1, 3)]}}))
    staging = tmp_path / ".staging" / "ch07"
    staging.mkdir(parents=True)
    assert sys7.chapter_json(staging, 5) is not None and sys7.chapter_json(staging, 2) is None
    alpha = {"alpha": 0.5, "alpha_low": 0.4, "alpha_high": 0.6}
    # model=None: the saved curve must be used, nothing measured.
    gain, source = sys7.spec_gain_vs_batch(None, [1, 4], 2, alpha, 0.1, out_dir=staging)
    assert "chapter 5" in source and list(gain.batch) == [1, 4]
    assert (gain.gain_low <= gain.gain).all() and (gain.gain <= gain.gain_high).all()


def test_anchor_table_collects_every_chapter_and_ours():
    import importlib
    import pkgutil

    import studylib.experiments as pkg

    sources = set()
    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name.startswith("ch") and m.name[2:4].isdigit():
            anchors = getattr(importlib.import_module(f"studylib.experiments.{m.name}"), "ANCHORS", None)
            if anchors is not None:
                recs = anchors.to_dict("records") if hasattr(anchors, "to_dict") else anchors
                sources |= {r["source"] for r in recs}
    ours = [{"source": "this study", "result": "1.0x", "model": "m", "hardware": "h"}]
    df = report.anchors_frame(ours)
    assert sources <= set(df.source) and report.ANCHORS[0]["source"] in sources
    assert df.iloc[-1].source == "this study" and df.iloc[-1].chapter == 7


# ------------------------------------------------------------------------------ tiny model run


def test_missing_keyword_is_reported_not_guessed(monkeypatch):
    def generate(model, prompt_ids, max_new_tokens, sampling=None, tokenizer=None, gamma=1):
        raise AssertionError("must not be called")

    monkeypatch.setattr(cc, "get_decoder", lambda method: generate)
    arm = cc.make_arm((cc.PREFIX, "prompt-lookup"), OPTS, ATT)
    assert cc.missing_options("prompt-lookup", arm) == ["prefix_store"]
    with pytest.raises(StudylibError, match="prefix_store"):
        cc.decode_arm(None, None, arm, [1, 2, 3], 2)


def test_lossless_arms_reproduce_ar_on_a_tiny_model(tiny):
    from studylib.workloads.prefix import PrefixRequest, PrefixWorkload

    model, tok = tiny
    shared = tok.encode("a shared system prompt that both requests start with. ")
    reqs = [PrefixRequest(f"q{i}", shared + tok.encode(q), 6, "g") for i, q in enumerate(("one?", "two!"))]
    wls = {"w": cc.NamedWorkload("w", PrefixWorkload("w", reqs, "two requests"))}
    opts = {**OPTS, "lookahead": {"window": 2, "ngram": 3, "guesses": 2}}
    arms = cc.single_arms(opts, ATT, decoders=("prompt-lookup", "lookahead"))
    # Every decoder that composes with the prefix cache in this checkout is stacked on it too.
    stacks = [cc.make_arm((cc.PREFIX, d), opts, ATT) for d in cc.DECODERS if d != "speculative"]
    arms += [a for a in stacks if cc.probe(model, tok, a, block_size=4) is None]
    runs = cc.run_arms(model, tok, wls, arms, block_size=4, capacity_tokens=256, progress=False)
    assert len(runs) == 2 * len(arms)
    summary = cc.latency_summary(runs)
    lossless = summary[summary.lossless]
    assert (lossless.exact_match == 1.0).all()
    hits = runs[runs.arm == cc.PREFIX].sort_values("order").hit_tokens.tolist()
    assert hits[0] == 0 and hits[1] > 0  # the store persists across the workload's requests


def test_selection_and_confirmation_stand_side_by_side_for_each_chosen_stack():
    sel = pd.DataFrame([{"workload": "chat", "stack": "prefix cache", "requests": 10, "speedup": 1.05, "low": 0.96,
                         "high": 1.11, "ttft_speedup": 12.39},
                        {"workload": "xsum", "stack": "sps", "requests": 10, "speedup": 2.0, "low": 1.5, "high": 2.5,
                         "ttft_speedup": 1.0}])
    conf = sel.iloc[:1].assign(speedup=1.0, low=0.98, high=1.07, ttft_speedup=11.5, requests=12)
    got = report.selection_vs_confirmation(sel, conf)
    assert got.workload.tolist() == ["chat"]  # a stack the confirmation run did not rerun has no row
    r = got.iloc[0]
    assert r["TTFT gain, selection pass"] == "12.39" and r["TTFT gain, confirmation run"] == "11.50"
    assert r["speed-up, confirmation run"] == "1.00 [0.98, 1.07]" and r["requests (selection / confirmation)"] == "10 / 12"
    nan = report.selection_vs_confirmation(sel, conf.assign(ttft_speedup=float("nan")))
    assert nan.iloc[0]["TTFT gain, confirmation run"] == "-"  # never "nan" on the page


def test_a_stack_slower_than_a_shorter_one_is_cut_back_to_it():
    """Prompt lookup helped alone, but the prefix cache + prompt lookup stack measured slower than the
    prefix cache alone: the settled stack is the prefix cache, and the note says why."""
    plan = stk.plan_stack({cc.PREFIX: (3.0, 2.8, 3.2), "prompt-lookup": (1.3, 1.1, 1.5)}, True, always)
    assert plan.stack == (cc.PREFIX, "prompt-lookup")
    names = [cc.make_arm(t, OPTS, ATT).name for t in plan.chain]
    summary = pd.DataFrame({"workload": ["w", "w", "x", "x"], "arm": names + names, "speedup": [3.0, 2.5, 3.0, 3.4]})
    settled = stk.settle_stacks({"w": plan, "x": plan}, summary, OPTS, ATT)
    assert settled["w"].stack == (cc.PREFIX,)
    assert settled["w"].notes[-1] == "prompt-lookup dropped: the stack with it measured 2.50x, below the 3.00x of prefix cache"
    assert settled["x"].stack == plan.stack and settled["x"].notes == plan.notes  # the longer stack was faster
    # a step not measured (NaN) settles nothing; a tie keeps the shorter stack (argmax takes the first)
    unmeasured = summary.assign(speedup=[3.0, float("nan"), 3.0, 3.0])
    again = stk.settle_stacks({"w": plan, "x": plan}, unmeasured, OPTS, ATT)
    assert again["w"] == plan and again["x"].stack == (cc.PREFIX,)


def test_auto_draft_reads_chapter_2s_search_and_never_a_leftover_distilled_draft(tiny, tmp_path, monkeypatch):
    # A distilled draft cached by an earlier train-draft must not change what the chapter measures: a cold
    # machine would not have it. ``auto`` takes chapter 2's cached self:auto layers, else the early exit.
    from studylib.decoding import drafts
    from studylib.experiments.ch07_combined import chapter_draft

    model, _ = tiny
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))
    monkeypatch.setattr(drafts, "resolve_draft", _refuse_distilled(drafts.resolve_draft))
    _, why = chapter_draft(model)
    assert why.startswith("self:exit:") and "no cached self:auto search" in why
    (tmp_path / "self_spec").mkdir(exist_ok=True)
    (tmp_path / "self_spec" / "x.json").write_text(json.dumps({"model": model.config.name, "layers": [0]}))
    draft, why = chapter_draft(model)
    assert "cached self:auto search" in why and "distilled" not in why


def _refuse_distilled(resolve):
    def wrapped(spec, model, *a, **k):
        assert spec != "distilled", "auto asked for the distilled draft"
        return resolve(spec, model, *a, **k)
    return wrapped


def test_a_whole_run_measures_the_sparse_growth_in_its_own_process():
    from studylib.experiments import ch07_runs

    out = ch07_runs.latency_run("tiny-random", "dense", "fp32", {"chat": []}, 2, 4, 64, 1, 2, 1500, 0, "auto", None,
                                4, 8, 3, "lookahead:2,4,2", "sinks:4,28", sparse_contexts=[48, 32, 96],
                                sparse_steps=2, sparse_prompts=2)
    assert set(out) == {"latency:chat", ch07_runs.GROWTH, ch07_runs.GAIN_LONG}
    assert out["latency:chat"] == 1.0 and all(out[k] > 0 for k in (ch07_runs.GROWTH, ch07_runs.GAIN_LONG))
