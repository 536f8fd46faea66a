"""Chapter 5's C8 row on synthetic whole runs: what the prefix cache does to TTFT and to TPOT, per whole
run, judged as declared in notebooks/params/decisions.yaml (C8@5): holds, does not hold, or neither."""

from __future__ import annotations

import pandas as pd

from studylib import decisions
from studylib.claims import FAILS, HOLDS, INCONCLUSIVE
from studylib.experiments import ch05_interplay as inter
from studylib.experiments import ch05_runs as runs5

LOOKUP = "interaction:continuous+radix+lookup:8,3"


def whole_runs_of(ttft_gains, tpot_gains, lookup=(0.70, 0.71, 0.69, 0.72, 0.70)):
    """Whole runs whose per-run TTFT and TPOT gains (without / with the cache) and lookup interaction (the
    lookup's gain inside the batch over its gain alone; None: no lookup arm) are the given ones."""
    from studylib.bench.whole_runs import WholeRuns

    lookup = [None] * len(ttft_gains) if lookup is None else lookup
    return WholeRuns("studylib.experiments.ch05_runs:synthetic", {}, [  # chapter 5's drift
        {"metrics": {"ttft_gain:continuous": a, "tpot_gain:continuous": b, **({LOOKUP: c} if c is not None else {})}}
        for a, b, c in zip(ttft_gains, tpot_gains, lookup[: len(ttft_gains)], strict=True)])


TTFT = [1.9, 2.0, 2.1, 1.95, 2.05]
FLAT = [0.99, 0.995, 1.00, 1.005, 1.01]  # TPOT gain 1.00, CI inside [0.75, 1.25] with the session drift
FASTER = [1.78, 1.79, 1.80, 1.81, 1.82]  # the cache cuts TPOT 1.8x, tight CI
EDGE = [1.10, 1.15, 1.20, 1.12, 1.18]  # a TPOT CI across the band's upper edge


def test_the_rule_is_an_equivalence_test_on_tpot():
    d = inter.EQUIVALENCE_DELTA
    ok = inter.ttft_not_tpot((2.0, 1.9, 2.1, 5), (1.0, 0.98, 1.02, 5))
    assert all(ok["not_tpot"].values()) and not all(ok["tpot_too"].values())
    fast = inter.ttft_not_tpot((2.0, 1.9, 2.1, 5), (1.8, 1.75, 1.85, 5))
    assert not all(fast["not_tpot"].values()) and all(fast["tpot_too"].values())
    # a TPOT CI that reaches past the band shows neither "unchanged" nor "shortened"
    wide = inter.ttft_not_tpot((2.0, 1.9, 2.1, 5), (1.0, 1 - 2 * d, 1 + 2 * d, 5))
    assert not all(wide["not_tpot"].values()) and not all(wide["tpot_too"].values())
    # a TTFT gain inside the band is no help to TTFT
    assert not all(inter.ttft_not_tpot((1.02, 1.01, 1.03, 5), (1.0, 0.99, 1.01, 5))["not_tpot"].values())
    assert not any(inter.ttft_not_tpot(2.0, 1.0)["not_tpot"].values())  # no CI, no pass


def test_c8_does_not_hold_when_the_cache_cuts_tpot_too():
    rows = runs5.judge_c8(whole_runs_of(TTFT, FASTER), "c")
    assert rows[0].role == "decision" and rows[0].verdict == FAILS and rows[1].verdict == FAILS
    assert rows[1].unit == "whole runs" and rows[1].n == 5 and "wholly outside the equivalence band" in rows[1].conditions
    text = runs5.c8_text(whole_runs_of(TTFT, FASTER))
    assert "also shortens TPOT" in text and "1.80x" in text


def test_c8_holds_when_tpot_is_unchanged_within_the_band():
    rows = runs5.judge_c8(whole_runs_of(TTFT, FLAT), "c")
    assert rows[0].verdict == HOLDS
    assert "unchanged within" in runs5.c8_text(whole_runs_of(TTFT, FLAT))


def test_neither_outcome_is_inconclusive_not_a_condition_that_holds():
    # a TPOT CI across the band's edge is neither "unchanged" nor "changed": no reading holds by default
    rows = runs5.judge_c8(whole_runs_of(TTFT, EDGE), "c")
    assert rows[0].verdict == INCONCLUSIVE and "neither" in rows[1].conditions
    # a TTFT gain that does not clear the band fails the claim's reading whatever TPOT does
    assert runs5.judge_c8(whole_runs_of([0.9, 0.95, 0.92, 0.93, 0.94], FLAT), "c")[0].verdict == FAILS


def test_below_five_runs_c8_is_inconclusive_whichever_way_it_went():
    for tpot in (FLAT, FASTER):
        rows = runs5.judge_c8(whole_runs_of(TTFT[:3], tpot[:3]), "c")
        assert all(r.verdict == INCONCLUSIVE for r in rows), [(r.metric, r.verdict) for r in rows]


def test_rows_are_judged_as_declared():
    for tpot in (FLAT, FASTER, FLAT[:3], EDGE):
        rows = runs5.judge_c8(whole_runs_of(TTFT[: len(tpot)], tpot), "c")
        assert len(decisions.stamp(rows, 5)) == 3
    assert len(decisions.stamp(runs5.judge_c8(whole_runs_of(TTFT, FLAT, lookup=None), "c"), 5)) == 3


def test_speculation_inside_the_batch_is_the_second_part():
    """C8's other example, measured: the lookup's gain inside the batch over its gain alone. Below 1 holds,
    wholly above 1 does not, across 1 (or too few runs, or no lookup arm) decides nothing; C8@5 is both
    parts at once."""
    def part(**kw):
        rows = runs5.judge_c8(whole_runs_of(TTFT, FLAT, **kw), "c")
        return rows[0], next(r for r in rows if r.metric.startswith(runs5.C8_BATCH))

    decision, shrinks = part()
    assert shrinks.verdict == HOLDS and decision.verdict == HOLDS and (shrinks.unit, shrinks.n) == ("whole runs", 5)
    assert shrinks.measured == __import__("pytest").approx(0.704, rel=0.01)
    decision, grows = part(lookup=[1.4, 1.42, 1.38, 1.41, 1.39])
    assert grows.verdict == FAILS and decision.verdict == FAILS
    assert part(lookup=[0.9, 1.1, 1.0, 0.95, 1.05])[1].verdict == INCONCLUSIVE  # across 1: neither
    decision, missing = part(lookup=None)
    assert missing.verdict == INCONCLUSIVE and "not measured" in missing.metric and decision.verdict == INCONCLUSIVE
    few = runs5.judge_c8(whole_runs_of(TTFT[:3], FLAT[:3]), "c")
    assert next(r for r in few if r.metric.startswith(runs5.C8_BATCH)).verdict == INCONCLUSIVE


def test_the_c8_sentence_names_the_verify_block_the_table_was_built_for():
    """A tree drafter verifies 17 tokens; the sentence once said gamma + 1 = 6 beside a table built for 17."""
    curve = pd.DataFrame({"batch": [1, 1, 8, 8], "tokens_per_seq": [1, 17, 1, 17],
                          "step_s": [0.01, 0.03, 0.02, 0.2]})
    c8 = inter.c8_table(curve, 0.5, 5, 0.4, tokens_per_step=1.8, verify_tokens=17, draft_forwards=5)
    assert inter.explain_c8(c8, 5, 17).startswith("Verifying 17 tokens per sequence costs 3.00x")
    assert inter.explain_c8(c8, 5).startswith("Verifying 6 tokens")  # a chain of 5 drafts


def test_the_band_is_wider_than_what_the_instrument_can_resolve():
    """A band narrower than the drift-only CI of five identical runs could never hold (a check that cannot
    hold tests nothing); +-0.10 was such a band at C8's family level under an earlier declared drift."""
    confidence = decisions.level("C8", 5)[0]
    floor = inter.band_floor(confidence)
    assert 0 < floor < inter.EQUIVALENCE_DELTA
    same = whole_runs_of(TTFT, [1.0] * 5).estimate("tpot_gain:continuous", confidence)
    assert same.ci_high - 1 == __import__("pytest").approx(floor, rel=1e-6)
    # and it can hold with the margin every bound keeps from an edge (its own Monte Carlo error): a third
    # condition in C8's family would push identical runs past the band (98.3%: 1.263 > 1.25)
    from studylib.verdict import guard

    assert same.ci_high + guard(same.mc_error) < 1 + inter.EQUIVALENCE_DELTA
    assert runs5.judge_c8(whole_runs_of(TTFT, [1.0] * 5), "c")[1].verdict == HOLDS


def test_a_bound_within_its_own_error_of_a_band_edge_is_neither_inside_nor_outside():
    # the band reading treats a bound near an edge as the verdict rules treat a bound near a bar
    assert inter.band_state(0.80, 1.20, 0.75, 1.25) == "inside"
    assert inter.band_state(0.80, 1.20, 0.75, 1.25, mc_error=0.08) == "straddles"
    assert inter.band_state(1.30, 1.60, 0.75, 1.25) == "outside"
    assert inter.band_state(1.30, 1.60, 0.75, 1.25, mc_error=0.08) == "straddles"
    assert inter.band_state(1.40, 1.60, 0.75, 1.25, mc_error=0.08) == "outside"


def test_the_c8_row_records_the_error_its_band_reading_guarded_with():
    rows = runs5.judge_c8(whole_runs_of(TTFT, FASTER), "c")
    assert rows[1].mc_error is not None and rows[1].mc_error > 0
