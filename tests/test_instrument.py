"""The instrument card (``workbook.instrument``): a view of the chapters' machine-level numbers."""

from __future__ import annotations

import json
from pathlib import Path

from studylib.workbook import instrument


def _write(out: Path, chapter: int, measurements: dict, params: dict | None = None) -> None:
    (out / f"ch{chapter:02d}.json").write_text(json.dumps({"chapter": chapter, "measurements": measurements,
                                                           "params": {"profile": "t"}}))
    index = out / "index.json"
    data = json.loads(index.read_text()) if index.exists() else {"chapters": {}}
    data["chapters"][str(chapter)] = {"params": params or {}}
    index.write_text(json.dumps(data))


def _runs(*gbs: float) -> dict:
    return {"target": "m:f", "params": {}, "runs": [
        {"started": f"2026-12-06T0{i}:00:00+00:00", "load_before": [0.5, 0.4, 0.3], "bandwidth_gbs": g, "metrics": {}}
        for i, g in enumerate(gbs)]}


def test_the_card_gathers_each_chapters_numbers_with_their_conditions(tmp_path):
    _write(tmp_path, 1, {"whole_runs": _runs(20.0, 22.0, 21.0),
                         "step_vs_rows": [{"rows": 1, "ms": 7.0, "ms_low": 6.9, "ms_high": 7.2, "n": 10,
                                           "engine": "gguf int8", "kernel": "amx"},
                                          {"rows": 16, "ms": 20.0, "v": 2.9, "v_low": 2.8, "v_high": 3.0, "n": 10,
                                           "engine": "gguf int8", "kernel": "amx"}]},
           {"rows_context": 128, "rows_repeats": 10})
    _write(tmp_path, 5, {"whole_runs": _runs(30.0, 31.0),
                         "c8": [{"batch": 1, "step_ms": 6.0}, {"batch": 16, "step_ms": 18.0}],
                         "speculative_inputs": {"draft_cost": 0.5, "drafter": "eagle", "source": "chapter 2"}},
           {"weights": "gguf", "act": "int8", "step_context": 128, "step_repeats": 2})
    card = instrument.card(tmp_path)
    bw = card["bandwidth"]
    assert bw["runs"] == 5 and bw["chapters"] == [1, 5] and bw["low"] == 20.0 and bw["high"] == 31.0
    assert bw["median"] == 22.0
    by = {(x["kind"], x["chapter"], x.get("k")): x for x in card["lines"]}
    assert by[("step", 1, None)]["value"] == 7.0 and "context 128" in by[("step", 1, None)]["what"]
    assert by[("v", 1, 16)]["ci"] == [2.8, 3.0] and "one process" in by[("v", 1, 16)]["how"]
    assert by[("v", 5, 16)]["value"] == 3.0 and "gguf weights, int8" in by[("v", 5, 16)]["what"]
    assert by[("c", 5, None)]["value"] == 0.5 and "not measured here" in by[("c", 5, None)]["how"]
    assert "whole run" in by[("bandwidth", 1, None)]["what"]
    # the JSON it writes is the same card
    assert json.loads(instrument.write(tmp_path).read_text()) == json.loads(json.dumps(card))


def test_a_chapter_page_shows_its_own_lines_and_the_front_page_all(tmp_path):
    _write(tmp_path, 1, {"whole_runs": _runs(20.0, 22.0),
                         "step_vs_rows": [{"rows": 1, "ms": 7.0, "engine": "e1", "kernel": "k"}]}, {"rows_context": 64})
    _write(tmp_path, 6, {"decode": [{"pattern": "dense", "seq_len": 1024, "ms_per_token": 40.0},
                                    {"pattern": "dense", "seq_len": 1024, "ms_per_token": 42.0},
                                    {"pattern": "sinks", "seq_len": 1024, "ms_per_token": 30.0}]}, {})
    front = instrument.block(tmp_path)
    assert "e1" in front and "context 1024" in front and "41" in front  # dense's median; the sparse row is no step
    one = instrument.block(tmp_path, 1)
    assert "e1" in one and "context 1024" not in one and "This chapter's 2 runs" in one
    six = instrument.block(tmp_path, 6)
    assert "context 1024" in six and "e1" not in six
    # a chapter that measured none of it still ran on the instrument: its page shows the shared bandwidth
    three = instrument.block(tmp_path, 3)
    assert "median <b>21 GB/s</b>" in three and "<table" not in three and "This chapter's" not in three


def test_no_results_no_card(tmp_path):
    assert instrument.card(tmp_path) == {"bandwidth": None, "lines": [], "notes": [], "defects": []}
    assert instrument.block(tmp_path) == ""


def _two_chapters(tmp_path, ch8_prefix: int, ch8_step: float):
    """Chapters 1 and 8 time the same one-row forward (gguf weights, int8 arithmetic, dense KV, causal)."""
    _write(tmp_path, 1, {"step_vs_rows": [{"rows": 1, "ms": 7.0, "ms_low": 6.9, "ms_high": 7.1, "n": 10,
                                           "engine": "gguf int8", "kernel": "amx"}]}, {"rows_context": 128})
    _write(tmp_path, 8, {"step_cost": [{"arm": "gguf@int8", "rows": 1, "ms": ch8_step, "n": 5}]},
           {"step_prefix": ch8_prefix, "step_repeats": 5})


def test_one_quantity_with_two_values_needs_a_reason(tmp_path):
    # chapter 1 and chapter 3 time the same one-row step (gguf, int8, dense KV, context 128): 7.0 and 6.0 ms
    # disagree, and nothing says why
    _two_chapters(tmp_path, 128, 6.0)
    c = instrument.card(tmp_path)
    assert len(c["defects"]) == 1 and "7 (chapter 1) and 6 (chapter 8)" in c["defects"][0]
    assert "no reason" in c["defects"][0] and not c["notes"]
    from studylib.workbook.assemble import book_defects

    assert book_defects(tmp_path)["instrument card"] == c["defects"]
    # a reason given for the pair turns the defect into a note the card prints
    instrument.REASONS[("step", 1, 8)] = "chapter 8 times its step in a sweep over formats."
    try:
        c = instrument.card(tmp_path)
        assert not c["defects"] and c["notes"][0]["text"].endswith("Chapter 8 times its step in a sweep over formats.")
        assert "one-row decode step 7 against 6" in c["notes"][0]["text"]
        assert "Chapter 8 times its step" in instrument.block(tmp_path, 8)
    finally:
        del instrument.REASONS[("step", 1, 8)]


def test_a_condition_that_differs_is_stated_and_values_that_agree_say_nothing(tmp_path):
    _two_chapters(tmp_path, 256, 8.0)  # another context: a note naming it, no defect
    c = instrument.card(tmp_path)
    assert not c["defects"] and "context: 128 tokens against 256 tokens" in c["notes"][0]["text"]
    assert "context: 128 tokens against 256 tokens" in instrument.block(tmp_path)  # the front page's card
    assert "context: 128 tokens against 256 tokens" in instrument.block(tmp_path, 1)
    _two_chapters(tmp_path, 128, 7.2)  # within 5% of each other: one value, no note
    c = instrument.card(tmp_path)
    assert not c["defects"] and not c["notes"]


def test_a_default_no_profile_sets_is_read_from_the_executed_notebook(tmp_path):
    """Chapter 1's rows sweep ran at its notebook's default context (256), which no profile sets: the card
    reads it from the executed notebook's parameter cells (the injected one overriding the defaults)."""
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]},
                     "source": "rows_context = 256  # tokens already in the cache\nrepeats = 3\nf = open\n"},
                    {"cell_type": "code", "metadata": {"tags": ["injected-parameters"]}, "source": "repeats = 10\n"}]}
    (tmp_path / "ch01.ipynb").write_text(json.dumps(nb))
    _write(tmp_path, 1, {"step_vs_rows": [{"rows": 1, "ms": 7.0, "engine": "gguf int8", "kernel": "amx"}]})
    line = instrument.card(tmp_path)["lines"][0]
    assert line["cond"]["context"] == 256 and "context 256" in line["what"]
    assert instrument._executed_params(nb) == {"rows_context": 256, "repeats": 10}


def test_engine_names_keep_what_tells_two_engines_apart():
    assert instrument._engine_named("gguf int8") == instrument._engine_named("gguf@int8") == \
        "gguf weights, int8 arithmetic"
    assert instrument._engine_named("dense") == "dense float32"
    assert instrument._engine_named("dense per-op") != instrument._engine_named("dense")
    assert instrument._engine_named("kv_int8") == "kv_int8"  # an arm, not a weight format
