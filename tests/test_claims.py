"""Verdict rules on synthetic measurements: claims that hold, hold under conditions and do not hold."""

import json

import pytest

from studylib.bench.stats import Estimate, estimate
from studylib.claims import (
    CLAIMS,
    CONDITIONAL,
    FAILS,
    HOLDS,
    Verdict,
    format_measured,
    judge_all,
    judge_at_least,
    judge_at_most,
    load_verdicts,
    verdict_frame,
    verdict_table,
    verdict_text,
)


def est(value, lo, hi):
    return Estimate(value, lo, hi, 5, [value] * 5)


def test_registry_has_c1_to_c8_with_chinese_quotes():
    assert list(CLAIMS) == [f"C{i}" for i in range(1, 9)]
    for c in CLAIMS.values():
        assert any("\u4e00" <= ch <= "\u9fff" for ch in c.quote_zh), c.id
        assert c.text and c.decides and c.section


@pytest.mark.parametrize("value,lo,hi,expected", [
    (12.0, 10.5, 13.0, HOLDS),  # whole CI above 10x
    (10.4, 9.0, 11.0, CONDITIONAL),  # point meets, CI crosses
    (6.0, 5.0, 7.0, FAILS),
])
def test_at_least_uses_the_ci_low_end(value, lo, hi, expected):
    v = judge_at_least("C7", "latency reduction (x)", est(value, lo, hi), 10.0, ">10x", "smollm2-135m, CPU", 7)
    assert v.verdict == expected
    assert v.measured == value and v.ci == (lo, hi)
    assert v.claim == CLAIMS["C7"].text


def test_at_least_partial_level_gives_conditional_with_reason():
    v = judge_at_least("C7", "speedup", est(3.0, 2.8, 3.2), 10.0, ">10x", "cpu", 7, partial=2.0)
    assert v.verdict == CONDITIONAL
    assert "short of the claimed 10" in v.conditions
    assert judge_at_least("C7", "speedup", est(1.5, 1.4, 1.6), 10.0, ">10x", "", 7, partial=2.0).verdict == FAILS


def test_at_least_per_workload_holds_only_where_met():
    per = {"chat": est(2.5, 2.2, 2.8), "code": est(1.1, 0.9, 1.3), "summaries": est(0.8, 0.7, 0.9)}
    v = judge_at_least("C3", "speedup", per, 1.0, ">1x", "smollm2", 2)
    assert v.verdict == CONDITIONAL
    assert v.measured == 2.5  # the best case is shown and named
    assert "best case shown: chat" in v.conditions and "not on summaries" in v.conditions
    assert judge_at_least("C3", "speedup", {"a": est(2, 1.5, 3), "b": est(3, 2, 4)}, 1.0, "", "", 2).verdict == HOLDS
    assert judge_at_least("C3", "speedup", {"a": est(0.5, 0.4, 0.6)}, 1.0, "", "", 2).verdict == FAILS


def test_at_most_mirrors_at_least():
    assert judge_at_most("C6", "exponent", est(1.05, 1.0, 1.1), 1.2, "<2", "", 6).verdict == HOLDS
    assert judge_at_most("C6", "exponent", est(1.15, 1.0, 1.3), 1.2, "<2", "", 6).verdict == CONDITIONAL
    assert judge_at_most("C6", "exponent", est(1.9, 1.8, 2.0), 1.2, "<2", "", 6, partial=1.5).verdict == FAILS


def test_plain_numbers_and_nan():
    assert judge_at_least("C1", "R^2", 0.995, 0.99, ">=0.99", "", 1).verdict == HOLDS
    assert judge_at_least("C1", "R^2", 0.98, 0.99, ">=0.99", "", 1).verdict == FAILS
    assert judge_at_least("C1", "R^2", float("nan"), 0.99, ">=0.99", "", 1).verdict == FAILS


def test_real_estimate_from_samples():
    v = judge_at_least("C3", "tokens per forward", estimate([2.0, 2.1, 2.2, 2.05, 2.15]), 1.0, ">1", "", 2)
    assert v.verdict == HOLDS and v.ci[0] <= v.measured <= v.ci[1]


def test_judge_all():
    checks = {"linear": True, "memory-bound": True}
    assert judge_all("C1", "checks", checks, "linear", "", 1).verdict == HOLDS
    v = judge_all("C1", "R^2", {"linear": True, "memory-bound": False}, "linear", "cpu", 1, measured=0.999)
    assert v.verdict == CONDITIONAL and "fails: memory-bound" in v.conditions and v.measured == 0.999
    v = judge_all("C1", "checks", {"linear": False, "memory-bound": False}, "linear", "", 1)
    assert v.verdict == FAILS and v.measured == "0/2 checks"


def test_verdict_validates_and_roundtrips():
    with pytest.raises(ValueError):
        Verdict("C9", "", "m", 1.0, None, "", HOLDS, "", 1)
    with pytest.raises(ValueError):
        Verdict("C1", "", "m", 1.0, None, "", "probably", "", 1)
    v = judge_at_least("C2", "fraction", est(0.7, 0.6, 0.8), 0.5, ">=0.5", "cpu", 1)
    back = Verdict.from_dict(json.loads(json.dumps(v.to_dict())))
    assert back == v


def test_tables_render(tmp_path):
    vs = [judge_at_least("C1", "R^2", 0.999, 0.99, ">=0.99", "cpu", 1),
          judge_at_most("C6", "exponent", est(1.9, 1.8, 2.0), 1.2, "<2", "", 6)]
    html = verdict_table(vs).to_html()
    assert "verdict-table" in html and "does not hold" in html and "#f8d4d4" in html
    assert list(verdict_frame(vs)["verdict"]) == [HOLDS, FAILS]
    assert "C6" in verdict_text(vs)
    assert format_measured(1.23456, (1.0, 1.5)) == "1.235 [1, 1.5]"
    assert format_measured(0.99974, None) == "0.9997"  # an R^2 must not round to 1
    (tmp_path / "ch06.json").write_text(json.dumps({"chapter": 6, "verdicts": [vs[1].to_dict()]}))
    (tmp_path / "ch01.json").write_text(json.dumps({"chapter": 1, "verdicts": [vs[0].to_dict()]}))
    assert [v.id for v in load_verdicts(tmp_path)] == ["C1", "C6"]
