"""The same kind of number across chapters: each figure read from its chapter's JSON, beside its conditions."""

import json

from studylib.workbook import same_kind


def _write(tmp_path, ch, data):
    (tmp_path / f"ch{ch:02d}.json").write_text(json.dumps(data), encoding="utf-8")


def _runs():
    # 5 repeats at saturation (rate None), TTFT p50 without / with the cache; a Poisson run (rate 2) is ignored
    rows = []
    for rep, (cold, warm) in enumerate([(2.0, 1.6), (2.2, 1.8), (2.1, 1.7), (1.9, 1.6), (2.0, 1.7)]):
        rows += [{"arm": "continuous", "rate": None, "repeat": rep, "ttft_p50_s": cold},
                 {"arm": "continuous+radix", "rate": None, "repeat": rep, "ttft_p50_s": warm},
                 {"arm": "continuous", "rate": 2.0, "repeat": rep, "ttft_p50_s": 100.0}]
    return rows


def _study(tmp_path):
    _write(tmp_path, 4, {"params": {"system_tokens": 1024}, "measurements": {"summary": [
        {"workload": "no_sharing", "TTFT speedup": 1.01, "TTFT speedup CI": [0.9, 1.1], "requests": 10},
        {"workload": "few_shot", "TTFT speedup": 3.5, "TTFT speedup CI": [3.1, 3.9], "requests": 12},
        {"workload": "system_prompt", "TTFT speedup": 14.2, "TTFT speedup CI": [13.0, 15.1], "requests": 10,
         "hit rate": 0.88}]}})
    _write(tmp_path, 5, {"params": {"n_requests": 64, "n_systems": 4, "system_tokens": 128, "max_new_tokens": 48},
                         "measurements": {"runs": _runs(), "gains_over_runs": [
                             {"treated": "continuous", "baseline": "sequential", "gain": 4.0, "ci_low": 3.9,
                              "ci_high": 4.3, "repeats": 5},
                             {"treated": "continuous+radix", "baseline": "sequential", "gain": 6.7, "ci_low": 6.5,
                              "ci_high": 7.2, "repeats": 5}]},
                         "verdicts": [{"metric": "prefix cache: TTFT gain / TPOT gain, continuous at saturation",
                                       "measured": 1.19, "ci": [1.18, 1.22], "n": 5, "unit": "whole runs"}]})


def test_each_chapter_page_shows_its_own_figure_first_and_the_others_with_their_conditions(tmp_path):
    _study(tmp_path)
    page4 = same_kind.block(tmp_path, 4)
    assert page4.index("This chapter: <b>14.2x (95% CI 13 to 15.1, n=10 requests)</b>") < page4.index("Chapter 5")
    assert "system_prompt workload, one request at a time behind a 1024-token shared prompt, 88%" in page4
    assert "64 requests at once behind 4 shared 128-token prompts" in page4
    # chapter 5's figure is its own TTFT ratio, paired by repeat inside its main run: median 2.0 / median 1.7
    assert "<b>1.18x (95% CI" in page4 and "n=5 repeats in one process" in page4
    assert "<a href='ch05.html'>" in page4
    # chapter 5 appears in both kinds, but the throughput kind needs a second chapter to compare with
    assert "Throughput gain" not in same_kind.block(tmp_path, 5)
    assert same_kind.block(tmp_path, 3) == ""  # a chapter that shares no kind gets nothing


def test_a_kind_needs_two_measured_chapters_and_missing_results_are_skipped(tmp_path):
    _write(tmp_path, 4, {"measurements": {"summary": [{"workload": "system_prompt", "TTFT speedup": float("nan")}]}})
    _write(tmp_path, 5, {"params": {}, "measurements": {"runs": _runs()}})
    _write(tmp_path, 7, {"params": {}, "measurements": {"prefix_vs_output": [
        {"output_tokens": 1, "speedup": 5.4, "low": 4.9, "high": 5.8}]}})
    kinds = same_kind.figures(tmp_path)
    assert [[f.chapter for f in figs] for _, figs in kinds] == [[7, 5]]  # chapter 4's NaN is skipped
    (tmp_path / "ch07.json").unlink()
    assert same_kind.figures(tmp_path) == []  # one chapter alone is no comparison
    assert same_kind.block(tmp_path) == ""


def test_chapter_7_reading_chapter_5s_runs_says_so(tmp_path):
    _study(tmp_path)
    _write(tmp_path, 7, {"params": {"n_requests": 10}, "measurements": {"prefix_vs_output": [
        {"output_tokens": 1, "speedup": 5.4, "low": 4.9, "high": 5.8},
        {"output_tokens": 16, "speedup": 1.6, "low": 1.5, "high": 1.7}],
        "confirmation": [{"workload": "system_prompt", "stack": "prefix cache", "ttft_speedup": 4.87}]},
        "verdicts": [{"metric": "throughput at saturation vs AR one at a time (x)", "measured": 6.7,
                      "ci": [6.5, 7.2], "n": 5, "unit": "whole runs",
                      "conditions": "continuous + radix; throughput measured in chapter 5 (...)"}]})
    kinds = {k.name: figs for k, figs in same_kind.figures(tmp_path)}
    ttft = kinds["Prefix-cache gain in time to first token"]
    assert [f.chapter for f in ttft] == [4, 7, 5]
    assert ttft[1].value == "5.4x (95% CI 4.9 to 5.8, n=10 requests)"
    assert "the confirmation run's fresh requests gave 4.87x" in ttft[1].conditions  # the other figure, beside it
    gain5, gain7 = kinds["Throughput gain of batching over one request at a time"]
    assert gain7.chapter == 7 and "read from chapter 5's saturation runs" in gain7.conditions
    assert gain5.value == gain7.value
    page = same_kind.block(tmp_path)
    assert "Throughput gain of batching over one request at a time.</b> The chapters report the same measurement." \
        in page
    assert "Prefix-cache gain in time to first token.</b> The figures differ because" in page


def test_decode_speed_in_chapters_1_and_8_stands_with_its_path_and_level(tmp_path):
    """The 4-bit engine's decode speed appears in chapters 1 and 8 on different paths: each says which, and
    a Bonferroni-corrected interval names its own level."""
    _write(tmp_path, 1, {"measurements": {"ar_bench": {"gguf": {
        "prompts": 10, "max_new_tokens": 48,
        "studylib_decode_tok_s": {"value": 147.0, "ci_low": 144.0, "ci_high": 150.0, "n": 10}}}}})
    _write(tmp_path, 8, {"measurements": {"speed": [
        {"arm": "gguf", "decode_tok_s": 137.0, "decode_tok_s_low": 135.0, "decode_tok_s_high": 143.0, "n": 10,
         "confidence": 0.99375},
        {"arm": "gguf@int8", "decode_tok_s": 213.0, "decode_tok_s_low": 209.0, "decode_tok_s_high": 240.0, "n": 10,
         "confidence": 0.99375}]}})
    page1 = same_kind.block(tmp_path, 1)
    assert "Single-stream decode speed" in page1 and "147 tok/s" in page1 and "137 tok/s" in page1
    assert "generate loop" in page1 and "fused C step" in page1 and "99.38% CI" in page1
    assert "with int8 activations 213 tok/s" in page1


def test_the_draft_cost_and_the_modelled_speculative_gain_stand_with_their_drafter_and_source(tmp_path):
    _write(tmp_path, 2, {"params": {"weights": "gguf", "act": "int8", "headline": "eagle@5,4,16"},
                         "measurements": {"headline": "eagle@5,4,16", "eagle_trees": [
                             {"method": "eagle@3", "c": 0.3, "prompts": 12},
                             {"method": "eagle@5,4,16", "c": 0.52, "prompts": 12}]}})
    _write(tmp_path, 5, {"measurements": {
        "speculative_inputs": {"alpha": 0.14, "gamma": 4, "draft_cost": 0.151, "source": "chapter 2's run (x)"},
        "c8": [{"batch": 4, "speculative_gain": 0.39}, {"batch": 1, "speculative_gain": 0.64}]}})
    _write(tmp_path, 7, {"params": {"draft": "self:exit:25", "weights": "gguf"}, "measurements": {
        "alpha": {"alpha": 0.15, "cost_ratio": 0.466, "requests": 50, "source": "this chapter's runs"},
        "spec_gain_vs_batch": [{"batch": 1, "gain": 0.38, "gain_low": 0.36, "gain_high": 0.41}]}})
    found = {k.name: figs for k, figs in same_kind.figures(tmp_path)}
    cost = {f.chapter: f for f in found["Draft cost c: one draft forward, in target forwards"]}
    assert cost[2].value.startswith("0.52") and "eagle@5,4,16" in cost[2].conditions  # the headline's row
    assert "int8 activations" in cost[2].conditions
    assert cost[5].value == "0.151" and "not measured there" in cost[5].conditions
    assert cost[7].value.startswith("0.466") and "self:exit:25" in cost[7].conditions
    # chapter 7 wrote "this chapter's runs"; read on chapter 2's page or the front page, it names chapter 7
    assert "source: chapter 7's runs" in cost[7].conditions and "this chapter" not in cost[7].conditions
    gain = {f.chapter: f for f in found["Speculative gain at batch 1, from the batching model"]}
    assert gain[5].value == "0.64x" and "batch 1" in gain[5].conditions  # the smallest batch, not the first row
    assert "acceptance 0.14 with 4 drafts" in gain[5].conditions  # a chain drafter's inputs
    assert gain[7].value == "0.38x" and "0.36 to 0.41" in gain[7].conditions
    page = same_kind.block(tmp_path, 5)
    assert "differ because" in page and "Chapter 7" in page


def test_the_modelled_gain_names_a_tree_drafters_own_inputs(tmp_path):
    _write(tmp_path, 5, {"measurements": {
        "speculative_inputs": {"alpha": 0.33, "gamma": 5, "draft_cost": 0.52, "drafter": "eagle@5,4,16",
                               "tokens_per_step": 1.72, "verify_tokens": 17, "draft_forwards": 5.0,
                               "source": "chapter 2's run"},
        "c8": [{"batch": 1, "speculative_gain": 0.6}]}})
    _write(tmp_path, 7, {"measurements": {"alpha": {"alpha": 0.15, "cost_ratio": 0.466, "source": "x"},
                                          "spec_gain_vs_batch": [{"batch": 1, "gain": 0.38}]}})
    gain = {f.chapter: f for k, figs in same_kind.figures(tmp_path) for f in figs if k.name.startswith("Speculative")}
    c = gain[5].conditions
    assert "eagle@5,4,16: 1.72 tokens per target forward" in c and "verify block of 17 tokens" in c
    assert "acceptance" not in c


def test_chapter_5s_ttft_gain_is_read_over_its_whole_runs_at_c8s_level_when_it_has_them():
    """The C8 row judges the TTFT gain over whole runs at C8's corrected level; the same-kind figure prints that
    interval, not a one-process one (a reader found 1.95x beside the row's 2.00x)."""
    from studylib.bench.whole_runs import WholeRuns
    from studylib.decisions import level

    runs = [{"pid": i, "started": "t", "load_before": [0.1], "load_after": [0.1], "bandwidth_gbs": 30.0,
             "seconds": 1.0, "metrics": {"ttft_gain:continuous": g}} for i, g in enumerate([2.1, 1.9, 2.0, 2.2, 1.95])]
    data = {"params": {"n_requests": 64}, "measurements": {
        "runs": _runs(), "whole_runs": {"target": "studylib.experiments.ch05_runs:timing_run", "params": {},
                                        "runs": runs}}}
    fig = same_kind._ttft_ch05(data)
    conf = level("C8", 5)[0]
    e = WholeRuns("studylib.experiments.ch05_runs:timing_run", {}, runs).estimate("ttft_gain:continuous", conf)
    assert "n=5 whole runs" in fig.value and f"{100 * conf:.4g}% CI" in fig.value
    assert fig.value.startswith(f"{e.value:.3g}")
    del data["measurements"]["whole_runs"]  # without them: the in-process repeats, labelled as such
    assert "repeats in one process" in same_kind._ttft_ch05(data).value
