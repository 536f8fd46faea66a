"""The same kind of number across chapters: each figure read from its chapter's JSON, beside its conditions."""

import json

from studylib.workbook import same_kind


def _write(tmp_path, ch, data):
    (tmp_path / f"ch{ch:02d}.json").write_text(json.dumps(data), encoding="utf-8")


def _study(tmp_path):
    _write(tmp_path, 4, {"params": {"system_tokens": 1024}, "measurements": {"summary": [
        {"workload": "no_sharing", "TTFT speedup": 1.01, "TTFT speedup CI": [0.9, 1.1], "requests": 10},
        {"workload": "few_shot", "TTFT speedup": 3.5, "TTFT speedup CI": [3.1, 3.9], "requests": 12},
        {"workload": "system_prompt", "TTFT speedup": 14.2, "TTFT speedup CI": [13.0, 15.1], "requests": 10,
         "hit rate": 0.88}]}})
    _write(tmp_path, 5, {"params": {"n_requests": 64, "n_systems": 4, "system_tokens": 128, "max_new_tokens": 48},
                         "measurements": {"gains": [
                             {"treated": "continuous", "baseline": "sequential", "gain": 4.0, "ci_low": 3.9,
                              "ci_high": 4.3, "repeats": 5},
                             {"treated": "continuous+radix", "baseline": "sequential", "gain": 6.7, "ci_low": 6.5,
                              "ci_high": 7.2, "repeats": 5}]},
                         "verdicts": [{"metric": "prefix cache: TTFT gain / TPOT gain, continuous at saturation",
                                       "measured": 1.19, "ci": [1.18, 1.22], "n": 5, "unit": "repeats"}]})


def test_each_chapter_page_shows_its_own_figure_first_and_the_others_with_their_conditions(tmp_path):
    _study(tmp_path)
    page4 = same_kind.block(tmp_path, 4)
    assert page4.index("This chapter: <b>14.2x (95% CI 13 to 15.1, n=10 requests)</b>") < page4.index("Chapter 5")
    assert "system_prompt workload, one request at a time behind a 1024-token shared prompt, 88%" in page4
    assert "64 requests at once behind 4 shared 128-token prompts" in page4
    assert "<a href='ch05.html'>" in page4
    # chapter 5 appears in both kinds, but the throughput kind needs a second chapter to compare with
    assert "Throughput gain" not in same_kind.block(tmp_path, 5)
    assert same_kind.block(tmp_path, 3) == ""  # a chapter that shares no kind gets nothing


def test_a_kind_needs_two_measured_chapters_and_missing_results_are_skipped(tmp_path):
    _write(tmp_path, 4, {"measurements": {"summary": [{"workload": "system_prompt", "TTFT speedup": float("nan")}]}})
    _study_only_5 = {"measurements": {}, "verdicts": []}
    _write(tmp_path, 5, _study_only_5)
    assert same_kind.figures(tmp_path) == []
    assert same_kind.block(tmp_path) == ""


def test_chapter_7_reading_chapter_5s_runs_says_so(tmp_path):
    _study(tmp_path)
    _write(tmp_path, 7, {"params": {"n_requests": 10}, "measurements": {"prefix_vs_output": [
        {"output_tokens": 1, "speedup": 5.4, "low": 4.9, "high": 5.8},
        {"output_tokens": 16, "speedup": 1.6, "low": 1.5, "high": 1.7}]},
        "verdicts": [{"metric": "throughput at saturation vs AR one at a time (x)", "measured": 6.7,
                      "ci": [6.5, 7.2], "n": 5, "unit": "repeats",
                      "conditions": "continuous + radix; throughput measured in chapter 5 (...)"}]})
    kinds = {k.name: figs for k, figs in same_kind.figures(tmp_path)}
    ttft = kinds["Prefix-cache gain in time to first token"]
    assert [f.chapter for f in ttft] == [4, 7, 5]
    assert ttft[1].value == "5.4x (95% CI 4.9 to 5.8, n=10 requests)"
    gain7 = kinds["Throughput gain of batching over one request at a time"][1]
    assert gain7.chapter == 7 and "read from chapter 5's saturation runs" in gain7.conditions
