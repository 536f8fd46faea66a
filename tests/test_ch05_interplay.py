"""Chapter 5's C8 rows on synthetic saturation runs: what the prefix cache does to TTFT and to TPOT,
per interleaved repeat, judged as declared in notebooks/params/decisions.yaml (C8@5)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from studylib import decisions
from studylib.claims import CONDITIONAL, FAILS, HOLDS, INCONCLUSIVE, corrected_confidence
from studylib.experiments import ch05_interplay as inter


def sat_runs(ttft_gains, tpot_gains) -> pd.DataFrame:
    """Saturation runs of continuous and continuous+radix, one repeat per pair of gains (without / with)."""
    rows = []
    for k, (g_ttft, g_tpot) in enumerate(zip(ttft_gains, tpot_gains, strict=True)):
        rows.append({"arm": "continuous", "rate": math.inf, "repeat": k, "ttft_p50_s": 1.0, "tpot_p50_s": 0.05})
        rows.append({"arm": "continuous+radix", "rate": math.inf, "repeat": k, "ttft_p50_s": 1.0 / g_ttft,
                     "tpot_p50_s": 0.05 / g_tpot})
    return pd.DataFrame(rows)


TTFT = [1.9, 2.0, 2.1, 1.95, 2.05]
FLAT = [0.98, 0.99, 1.00, 1.01, 1.02]  # TPOT gain 1.00 [0.98, 1.02]
FASTER = [1.78, 1.79, 1.80, 1.81, 1.82]  # the cache cuts TPOT 1.8x, tight CI


def by_metric(rows, prefix):
    return next(r for r in rows if r.metric.startswith(prefix))


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


def test_ttft_not_tpot_fails_when_the_cache_cuts_tpot_and_the_interaction_row_holds():
    rows = inter.judge_c8(sat_runs(TTFT, FASTER), "c")
    local, both = by_metric(rows, "prefix cache helps TTFT, not TPOT"), by_metric(rows, "prefix cache also shortens TPOT")
    assert local.verdict == FAILS  # the old rule (TTFT gain / TPOT gain >= 1) passed this
    assert both.verdict == HOLDS and "interaction with batching" in both.metric
    assert rows[0].role == "decision" and rows[0].verdict == CONDITIONAL
    assert all(r.unit == "repeats" and r.n == 5 for r in rows[1:])
    assert all(r.confidence == pytest.approx(corrected_confidence(2)) and r.tried == 2 for r in rows[1:])
    text = inter.c8_text(sat_runs(TTFT, FASTER))
    assert "also shortens TPOT" in text and "interaction with batching" in text and "1.80x" in text


def test_ttft_not_tpot_holds_when_tpot_is_unchanged_within_the_band():
    rows = inter.judge_c8(sat_runs(TTFT, FLAT), "c")
    assert by_metric(rows, "prefix cache helps TTFT, not TPOT").verdict == HOLDS
    assert by_metric(rows, "prefix cache also shortens TPOT").verdict == FAILS
    assert rows[0].verdict == CONDITIONAL
    assert "unchanged within" in inter.c8_text(sat_runs(TTFT, FLAT))


def test_below_five_repeats_every_row_is_inconclusive_whichever_way_it_went():
    for tpot in (FLAT, FASTER):
        rows = inter.judge_c8(sat_runs(TTFT[:3], tpot[:3]), "c")
        assert all(r.verdict == INCONCLUSIVE for r in rows), [(r.metric, r.verdict) for r in rows]
        assert all(r.n == 3 for r in rows[1:])
    one = inter.judge_c8(sat_runs(TTFT[:1], FLAT[:1]), "c")
    assert all(r.verdict == INCONCLUSIVE for r in one)
    assert "no CI" in inter.c8_text(sat_runs(TTFT[:1], FLAT[:1]))


def test_rows_are_judged_as_declared():
    for tpot in (FLAT, FASTER, FLAT[:3]):
        rows = inter.judge_c8(sat_runs(TTFT[: len(tpot)], tpot), "c")
        stamped = decisions.stamp(rows, 5)
        assert len(stamped) == 3


def test_the_c8_sentence_names_the_verify_block_the_table_was_built_for():
    """A tree drafter verifies 17 tokens; the sentence once said gamma + 1 = 6 beside a table built for 17."""
    curve = pd.DataFrame({"batch": [1, 1, 8, 8], "tokens_per_seq": [1, 17, 1, 17],
                          "step_s": [0.01, 0.03, 0.02, 0.2]})
    c8 = inter.c8_table(curve, 0.5, 5, 0.4, tokens_per_step=1.8, verify_tokens=17, draft_forwards=5)
    assert inter.explain_c8(c8, 5, 17).startswith("Verifying 17 tokens per sequence costs 3.00x")
    assert inter.explain_c8(c8, 5).startswith("Verifying 6 tokens")  # a chain of 5 drafts
