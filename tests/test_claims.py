"""The verdict rules on synthetic measurements: all four verdicts, the all-or-nothing checks, claims with
several parts, the minimum number of units behind a CI, and the study-level line per claim."""

import dataclasses
import json

import numpy as np
import pytest

from studylib.bench.stats import Estimate, estimate, ratio_estimate
from studylib.claims import (
    CLAIMS,
    CONDITIONAL,
    DECISION,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    MIN_UNITS,
    PART,
    Verdict,
    check_one_decision,
    corrected_confidence,
    decide_conditions,
    decide_parts,
    format_measured,
    judge_at_least,
    judge_at_most,
    judge_checks,
    load_verdicts,
    study_decisions,
    verdict_frame,
    verdict_markdown,
    verdict_table,
    verdict_text,
)


def est(value, lo, hi, n=12, method=None):
    return Estimate(value, lo, hi, n, [value] * n, method=method or "BCa bootstrap, 10,000 resamples")


def runs(value, lo, hi, n=5):
    """A CI over ``n`` whole runs (the only CI that counts repeats)."""
    return est(value, lo, hi, n, method="t on the log of the per-run medians (4 df)")


def test_registry_has_c1_to_c9_with_chinese_quotes():
    assert list(CLAIMS) == [f"C{i}" for i in range(1, 10)]
    for c in CLAIMS.values():
        assert any("\u4e00" <= ch <= "\u9fff" for ch in c.quote_zh), c.id
        assert c.text and c.decides and c.section


@pytest.mark.parametrize("value,lo,hi,expected", [
    (12.0, 10.5, 13.0, HOLDS),  # the whole CI above 10x
    (10.4, 9.0, 11.0, INCONCLUSIVE),  # the point meets the bar, the CI crosses it: no decision
    (9.5, 9.0, 11.0, INCONCLUSIVE),  # the point misses, the CI reaches it
    (6.0, 5.0, 7.0, FAILS),  # the whole CI below
])
def test_single_condition_is_decided_on_the_ci(value, lo, hi, expected):
    v = judge_at_least("C7", "latency reduction (x)", est(value, lo, hi), 10.0, ">10x", "smollm2-135m, CPU", 7)
    assert v.verdict == expected
    assert v.measured == value and v.ci == (lo, hi) and v.n == 12
    assert v.threshold == 10.0 and v.direction == "at_least" and v.role == DECISION
    assert v.claim == CLAIMS["C7"].text


def test_conditions_give_all_four_verdicts():
    per = {"chat": est(2.5, 2.2, 2.8), "code": est(1.1, 0.9, 1.3), "summaries": est(0.8, 0.7, 0.9)}
    v = judge_at_least("C3", "speedup", per, 1.0, ">1x", "smollm2", 2)
    assert v.verdict == CONDITIONAL
    assert v.measured == 2.5  # the best case is shown, and every condition is named with its n
    assert "shown: chat" in v.conditions and "clears the bar on chat; not on code, summaries" in v.conditions
    assert "n=12 prompts" in v.conditions
    held = judge_at_least("C3", "speedup", {"a": est(2, 1.5, 3), "b": est(3, 2, 4)}, 1.0, "", "", 2)
    assert held.verdict == HOLDS and held.measured == 2  # holds everywhere: the worst case is shown
    # the reviewer's case: one condition's point estimate clears, its CI crosses, the others fail
    lookahead = {"xsum": est(1.13, 0.88, 1.18), "chat": est(0.92, 0.85, 0.97), "code": est(0.87, 0.8, 0.95)}
    assert judge_at_least("C3", "speedup", lookahead, 1.0, "", "", 3).verdict == INCONCLUSIVE
    assert judge_at_least("C3", "speedup", {"a": est(0.5, 0.4, 0.6), "b": est(0.7, 0.6, 0.8)}, 1.0, "", "",
                          2).verdict == FAILS


def test_at_most_mirrors_at_least():
    assert judge_at_most("C6", "exponent", runs(1.05, 1.0, 1.1, 5), 1.2, "<2", "", 6, unit="whole runs").verdict == HOLDS
    assert judge_at_most("C6", "exponent", runs(1.15, 1.0, 1.3, 5), 1.2, "", "", 6, unit="whole runs").verdict \
        == INCONCLUSIVE
    assert judge_at_most("C6", "exponent", runs(1.9, 1.8, 2.0, 5), 1.2, "", "", 6, unit="whole runs").verdict == FAILS
    v = judge_at_most("C6", "ppl ratio", {"sinks": est(1.002, 0.999, 1.005), "window": est(2.0, 1.9, 2.1)},
                      1.01, "", "", 6, unit="documents")
    assert v.verdict == CONDITIONAL and v.direction == "at_most" and v.measured == 1.002


@pytest.mark.parametrize("unit", sorted(MIN_UNITS))
def test_too_few_units_never_decide(unit):
    need = MIN_UNITS[unit]
    assert need >= (5 if unit == "whole runs" else 10)
    make = runs if unit == "whole runs" else est
    clear = make(5.0, 4.0, 6.0, n=need)
    assert judge_at_least("C5", "gain", clear, 1.0, "", "", 5, unit=unit).verdict == HOLDS
    few = make(5.0, 4.0, 6.0, n=need - 1)
    v = judge_at_least("C5", "gain", few, 1.0, "", "", 5, unit=unit)
    assert v.verdict == INCONCLUSIVE and f"at least {need} {unit}" in v.conditions and v.n == need - 1
    # an undersampled miss cannot say "does not hold" either
    assert judge_at_least("C5", "gain", make(0.5, 0.4, 0.6, n=need - 1), 1.0, "", "", 5, unit=unit).verdict \
        == INCONCLUSIVE
    # and an undersampled condition beside a clearing one leaves the claim "under conditions"
    both = {"big": clear, "small": few}
    assert judge_at_least("C5", "gain", both, 1.0, "", "", 5, unit=unit).verdict == CONDITIONAL


def test_numbers_without_a_ci_and_nan_cannot_decide():
    assert judge_at_least("C1", "R^2", 0.995, 0.99, ">=0.99", "", 1).verdict == INCONCLUSIVE
    assert judge_at_least("C1", "R^2", float("nan"), 0.99, ">=0.99", "", 1).verdict == INCONCLUSIVE
    assert judge_at_least("C1", "R^2", (0.995, 0.992, 0.998), 0.99, "", "", 1).verdict == INCONCLUSIVE  # no n
    assert judge_at_least("C1", "R^2", (0.995, 0.992, 0.998, 10), 0.99, "", "", 1).verdict == HOLDS


def test_real_estimates_from_samples():
    rng = np.random.default_rng(0)
    v = judge_at_least("C3", "tokens per forward", estimate(2.0 + 0.1 * rng.random(12)), 1.0, ">1", "", 2)
    assert v.verdict == HOLDS and v.ci[0] <= v.measured <= v.ci[1] and v.n == 12
    one = estimate([3.0])
    assert one.n == 1 and np.isnan(one.ci_low)  # one sample has no CI ...
    assert judge_at_least("C3", "x", one, 1.0, "", "", 2).verdict == INCONCLUSIVE  # ... and decides nothing


def test_repeats_of_a_unit_are_one_unit():
    # 4 prompts x 2 repeats is 4 units, not 8
    e = estimate([1, 1.1, 2, 2.1, 3, 3.1, 4, 4.1], units=["a", "a", "b", "b", "c", "c", "d", "d"])
    assert e.n == 4 and e.samples == pytest.approx([1.05, 2.05, 3.05, 4.05])
    r = ratio_estimate([2, 2, 4, 4], [1, 1, 2, 2], units=[0, 0, 1, 1])
    assert r.n == 2 and r.value == pytest.approx(2.0)
    with pytest.raises(ValueError):
        estimate([1, 2], units=["a"])


def test_checks_are_all_or_nothing():
    checks = {"chat": True, "xsum": True}
    assert judge_checks("C3", "exact", checks, "lossless", "", 2).verdict == HOLDS
    v = judge_checks("C3", "exact", {"chat": True, "xsum": False}, "lossless", "cpu", 2)
    assert v.verdict == FAILS and "fails: xsum" in v.conditions and v.measured == "1/2 checks"
    assert v.direction == "check" and v.threshold is None and v.n is None
    v = judge_checks("C3", "sampling", {"exact sampler accepted": True, "wrong sampler rejected": False}, "", "", 2)
    assert v.verdict == FAILS  # a test without power decides nothing in the claim's favour


def test_checks_keep_the_monte_carlo_error_of_the_ci_they_show():
    shown = Estimate(1.8, 1.5, 2.1, 12, [], mc_error=0.013)
    v = judge_checks("C8", "growth", {"grows": True}, "", "", 7, measured=shown)
    assert v.ci == (1.5, 2.1) and v.mc_error == pytest.approx(0.013)
    assert judge_checks("C8", "growth", {"grows": True}, "", "", 7).mc_error is None  # no CI, no error


def test_parts_are_decided_by_the_weakest():
    quality = judge_at_least("C7", "quality", est(1.0, 0.995, 1.0), 0.99, ">99%", "", 7)
    latency = judge_at_least("C7", "latency", est(1.6, 1.0, 3.9), 10.0, ">10x", "", 7)
    thru = judge_at_least("C7", "throughput", est(2.6, 2.5, 2.7, 5), 8.0, "8-12x", "", 7, unit="whole runs")
    rows = decide_parts("C7", "quality, latency and throughput at once", [quality, latency, thru], "", "stack X", 7)
    assert rows[0].role == DECISION and all(r.role == PART for r in rows[1:])
    assert rows[0].verdict == FAILS and "latency: does not hold" in rows[0].conditions
    assert rows[0].measured == "1/3 parts hold"
    ok = decide_parts("C6", "cost and quality", [quality, quality], "", "", 7)[0]
    assert ok.verdict == HOLDS
    unsure = judge_at_least("C7", "latency", est(10.4, 9.0, 11.0), 10.0, "", "", 7)
    assert decide_parts("C7", "x", [quality, unsure], "", "", 7)[0].verdict == INCONCLUSIVE
    check_one_decision(rows)
    with pytest.raises(ValueError):
        check_one_decision([quality, latency])  # two decision rows for C7


def test_conditions_over_alternatives():
    yes = judge_checks("C8", "a", {"x": True}, "", "", 7)
    no = judge_checks("C8", "b", {"x": False}, "", "", 7)
    maybe = judge_at_least("C8", "c", est(1.0, 0.9, 1.1), 1.0, "", "", 7)
    assert decide_conditions("C8", "m", [yes, yes], "", "", 7)[0].verdict == HOLDS
    d = decide_conditions("C8", "m", [yes, no, maybe], "", "", 7)[0]
    assert d.verdict == CONDITIONAL and "holds for: a" in d.conditions and "b (does not hold)" in d.conditions
    assert decide_conditions("C8", "m", [no, maybe], "", "", 7)[0].verdict == INCONCLUSIVE
    assert decide_conditions("C8", "m", [no, no], "", "", 7)[0].verdict == FAILS
    assert d.measured == "1/3 hold"
    # a condition that holds only in part is counted beside the holds, never as one (the front page once
    # read C8 "2/2 hold" over two chapters that each held under conditions)
    partly = decide_conditions("C8", "p", [yes, no], "", "", 5)[0]
    assert partly.verdict == CONDITIONAL
    both = decide_conditions("C8", "m", [partly, partly], "", "", 7, names=["chapter 5", "chapter 7"])[0]
    assert both.verdict == CONDITIONAL and both.measured == "0/2 hold, 2 under conditions"
    assert "chapter 5 (under conditions)" in both.conditions


def test_study_has_one_line_per_claim():
    c3a = judge_checks("C3", "exact", {"x": True}, "", "", 2)
    c3b = judge_checks("C3", "exact", {"x": False}, "", "", 3)
    c1 = judge_at_least("C1", "R^2", est(0.999, 0.998, 0.9995), 0.99, "", "", 1)
    part = judge_at_least("C1", "step growth", est(1.4, 1.3, 1.5), 2.0, "", "", 1, role=PART)
    lines = study_decisions([c1, part, c3a, c3b])
    assert [d.id for d in lines] == ["C1", "C3"]
    assert lines[0] is c1 and lines[1].verdict == CONDITIONAL and "chapter 2" in lines[1].conditions
    md = verdict_markdown([c1, part, c3a, c3b])
    assert md.count("\n| C3 |") == 1 + 2 and "(n=12)" in md and "≥ 0.99" in md


def test_verdict_validates_and_roundtrips():
    with pytest.raises(ValueError):
        Verdict("C10", "", "m", 1.0, None, "", HOLDS, "", 1)
    with pytest.raises(ValueError):
        Verdict("C1", "", "m", 1.0, None, "", "probably", "", 1)
    with pytest.raises(ValueError):
        Verdict("C1", "", "m", 1.0, None, "", HOLDS, "", 1, direction="sideways")
    v = judge_at_least("C2", "fraction", est(0.7, 0.6, 0.8), 0.5, ">=0.5", "cpu", 1)
    d = json.loads(json.dumps(v.to_dict()))
    assert {"n", "threshold", "direction", "role", "unit"} <= set(d)
    assert Verdict.from_dict(d) == v


def test_tables_render(tmp_path):
    vs = [judge_at_least("C1", "R^2", est(0.999, 0.998, 0.9995), 0.99, ">=0.99", "cpu", 1),
          judge_at_most("C6", "exponent", runs(1.9, 1.8, 2.0, 5), 1.2, "<2", "", 6, unit="whole runs")]
    html = verdict_table(vs).to_html()
    assert "verdict-table" in html and "does not hold" in html and "#f8d4d4" in html
    assert list(verdict_frame(vs)["verdict"]) == [HOLDS, FAILS]
    assert "C6" in verdict_text(vs)
    assert format_measured(1.23456, (1.0, 1.5), 12) == "1.235 [1, 1.5] (n=12)"
    assert format_measured(0.99974, None) == "0.9997"  # an R^2 must not round to 1
    (tmp_path / "ch06.json").write_text(json.dumps({"chapter": 6, "verdicts": [vs[1].to_dict()]}))
    (tmp_path / "ch01.json").write_text(json.dumps({"chapter": 1, "verdicts": [vs[0].to_dict()]}))
    assert [v.id for v in load_verdicts(tmp_path)] == ["C1", "C6"]


def test_checks_that_compare_cis_need_their_units():
    assert judge_checks("C8", "x", {"x": True}, "", "", 7, n=10, unit="requests").verdict == HOLDS
    assert judge_checks("C8", "x", {"x": False}, "", "", 7, n=10, unit="requests").verdict == FAILS
    few = judge_checks("C8", "x", {"x": True}, "", "", 7, n=3, unit="requests")
    assert few.verdict == INCONCLUSIVE and few.n == 3 and "3 < 10 requests" in few.conditions
    assert judge_checks("C8", "x", {"x": False}, "", "", 7, n=3, unit="whole runs", exact=False).verdict == INCONCLUSIVE


def test_one_counterexample_decides_at_any_n_and_passing_checks_need_their_n():
    # an exactness check with one failing prompt out of 3 is a counterexample: does not hold
    assert judge_checks("C3", "x", {"p0": True, "p1": False, "p2": True}, "", "", 2,
                        unit="prompts").verdict == FAILS
    # three passing prompts are too few to say "holds"; ten are enough (n defaults to one per check)
    few = judge_checks("C3", "x", {f"p{i}": True for i in range(3)}, "", "", 2, unit="prompts")
    assert few.verdict == INCONCLUSIVE and few.n == 3
    assert judge_checks("C3", "x", {f"p{i}": True for i in range(10)}, "", "", 2, unit="prompts").verdict == HOLDS
    # a structural check (no unit) is not a sample
    assert judge_checks("C2", "x", {"formula": True}, "", "", 1).verdict == HOLDS


def test_rows_by_construction_never_decide():
    real = judge_at_least("C9", "speed", (2.5, 2.2, 2.8, 10), 2.0, "", "", 8)
    free = judge_checks("C9", "identical", {f"p{i}": True for i in range(10)}, "", "", 8, unit="prompts",
                        by_construction=True)
    worse = judge_at_least("C9", "quality", (0.9, 0.85, 0.95, 10), 0.99, "", "", 8)
    # the free row would lift the decision; it is shown and not counted
    d = decide_parts("C9", "both", [real, free, worse], "", "", 8)
    assert d[0].verdict == FAILS and "by construction" in d[0].conditions and len(d) == 4
    only_free = decide_parts("C9", "both", [free], "", "", 8)
    assert only_free[0].verdict == INCONCLUSIVE and only_free[0].by_construction
    c = decide_conditions("C9", "any", [decide_parts("C9", "a", [real, free], "", "", 8)[0],
                                          dataclasses.replace(free, metric="b")], "", "", 8)
    assert c[0].verdict == HOLDS and "1/1 hold" == c[0].measured


def test_corrected_confidence_and_no_power():
    assert corrected_confidence(1) == 0.95 and abs(corrected_confidence(3) - (1 - 0.05 / 3)) < 1e-12
    v = judge_at_least("C6", "task ratio", (1.0, 0.985, 1.02, 12), 0.99, "", "", 6,
                       unit="documents", power={"mdc": 0.0175, "has_power": False, "n_needed": 37})
    assert v.verdict == INCONCLUSIVE and "no power" in v.conditions and "37" in v.conditions
    # a CI wholly below the bar decides "does not hold" even without the power to see 1%
    w = judge_at_least("C6", "task ratio", (0.8, 0.7, 0.9, 12), 0.99, "", "", 6,
                       unit="documents", power={"mdc": 0.1, "has_power": False, "n_needed": 900})
    assert w.verdict == FAILS
    # the level shows in the note and survives the JSON round trip
    k = judge_at_least("C6", "s", (1.5, 1.2, 1.8, 10), 1.0, "", "", 6, confidence=corrected_confidence(3),
                       tried=3)
    assert "3 configurations" in k.conditions
    back = Verdict.from_dict(k.to_dict())
    assert back.confidence == k.confidence and back.tried == 3


def test_rotated_is_the_interleaving_order():
    from studylib.bench.stats import rotated

    assert rotated("abc", 0) == ["a", "b", "c"] and rotated("abc", 1) == ["b", "c", "a"]
    assert rotated("abc", 4) == ["b", "c", "a"] and rotated([], 3) == []
    # over as many units as arms, every arm runs first exactly once
    assert sorted(rotated("abcd", k)[0] for k in range(4)) == list("abcd")


def test_a_row_over_several_conditions_says_which_one_its_number_is():
    """Chapter 2's box printed 'speed-up, T=0: 0.515' with no word that it was one workload of three (the
    best; the verdict reads every workload)."""
    from studylib.claims import shown_condition

    fails = judge_at_least("C3", "speed-up", {"chat": est(0.3, 0.26, 0.37), "code": est(0.51, 0.45, 0.6)}, 1.0,
                           "", "c", 2)
    assert fails.measured == 0.51 and shown_condition(fails) == "on code, the best of 2 conditions"
    holds = judge_at_least("C3", "speed-up", {"chat": est(1.3, 1.2, 1.4), "code": est(1.6, 1.5, 1.7)}, 1.0,
                           "", "c", 2)
    assert holds.measured == 1.3 and shown_condition(holds) == "on chat, the worst of 2 conditions"
    one = judge_at_least("C3", "speed-up", {"chat": est(0.3, 0.26, 0.37)}, 1.0, "", "c", 2)
    assert shown_condition(one) == "on chat, the only condition"  # chapter 2's T=1 row read "the best condition"
    assert shown_condition(judge_at_least("C3", "speed-up", est(1.3, 1.2, 1.4), 1.0, "", "c", 2)) == ""


def test_repeats_count_only_from_a_ci_over_whole_runs():
    # five replays inside one process are not five runs of the machine: their CI counts no repeats
    replays = est(5.0, 4.0, 6.0, n=5)
    row = judge_at_least("C5", "gain", replays, 1.0, "", "", 5, unit="whole runs")
    assert row.verdict == INCONCLUSIVE and "not over whole runs" in row.conditions
    assert judge_at_least("C5", "gain", runs(5.0, 4.0, 6.0), 1.0, "", "", 5, unit="whole runs").verdict == HOLDS


def test_a_bound_within_its_monte_carlo_error_of_the_bar_neither_clears_nor_misses():
    near = Estimate(1.05, 1.0004, 1.1, 12, [1.0] * 12, mc_error=0.001)
    row = judge_at_least("C3", "speed-up", near, 1.0, "", "", 3)
    assert row.verdict == INCONCLUSIVE and "Monte Carlo error" in row.conditions and row.mc_error == 0.001
    far = Estimate(1.05, 1.01, 1.1, 12, [1.0] * 12, mc_error=0.001)
    assert judge_at_least("C3", "speed-up", far, 1.0, "", "", 3).verdict == HOLDS
    under = Estimate(0.95, 0.9, 0.9995, 12, [1.0] * 12, mc_error=0.001)
    assert judge_at_least("C3", "speed-up", under, 1.0, "", "", 3).verdict == INCONCLUSIVE


def test_the_power_rule_never_overrides_a_ci_that_clears_the_bar():
    power = {"has_power": False, "mdc": 0.02, "n_needed": 40}
    clears = judge_at_least("C6", "ratio", est(0.999, 0.995, 1.0), 0.99, "", "", 6, unit="documents", power=power)
    assert clears.verdict == HOLDS
    straddles = judge_at_least("C6", "ratio", est(0.99, 0.98, 1.0), 0.99, "", "", 6, unit="documents", power=power)
    assert straddles.verdict == INCONCLUSIVE and "no power" in straddles.conditions


def test_the_row_never_shows_an_undersampled_condition_while_another_decides():
    """The referee found C4's row showing a condition with 5 traces (its best point) beside conditions with
    10: the shown number then stood for the row without the units a decision needs."""
    from studylib.bench.stats import Estimate

    few = Estimate(0.99, 0.97, 1.0, 5, [0.99] * 5)
    enough = Estimate(0.96, 0.94, 0.98, 10, [0.96] * 10)
    row = judge_at_least("C4", "ratio", {"few traces": few, "ten traces": enough}, 0.95, "", "", 4, unit="traces")
    assert row.measured == pytest.approx(0.96) and "shown: ten traces" in row.conditions
    # with no decidable condition at all, the best point is still shown (and the row is inconclusive)
    only = judge_at_least("C4", "ratio", {"few traces": few}, 0.95, "", "", 4, unit="traces")
    assert only.measured == pytest.approx(0.99) and only.verdict == INCONCLUSIVE
