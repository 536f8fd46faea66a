"""The front page's "why": the model, its factors read from the chapters, the published table, the "when"."""

from __future__ import annotations

import json

import pytest

from studylib.errors import StudylibError
from studylib.workbook import why


def test_the_model_is_tau_over_the_cost_of_a_step():
    assert why.speculation_speedup(3.0, 1.0, 5, 0.0) == 3.0  # a free draft on a flat v: tau is the speed-up
    assert why.speculation_speedup(1.68, 3.34, 5, 0.62) == pytest.approx(1.68 / (3.34 + 3.1))
    assert why.batching_gain(16, 2.0) == 8.0
    assert why.speculation_speedup(1.0, 0.0, 0, 0.0) != why.speculation_speedup(1.0, 0.0, 0, 0.0)  # NaN, no /0


def test_a_gpu_roofline_keeps_v_at_one_until_the_ridge():
    # H100 SXM: 989 TFLOPS bf16 dense, 3.35 TB/s: the ridge is ~295 rows of 2-byte weights
    assert why.roofline_v(17, 989, 3.35) == 1.0
    assert why.roofline_v(64, 989, 3.35) == 1.0
    assert why.roofline_v(590, 989, 3.35) == pytest.approx(590 / (989 / 3.35), rel=1e-6)


def _study(tmp_path, table=None):
    (tmp_path / "ch02.json").write_text(json.dumps({
        "params": {"headline": "eagle@5,4,16"},
        "measurements": {"eagle_trees": [
            {"method": "eagle@5,4,16", "verify_tokens": 17, "draft_forwards_per_step": 5.0, "tau": 1.7, "c": 0.6,
             "v": 3.3}]},
        "verdicts": [{"metric": "wall-clock speedup over AR, eagle@5,4,16, T=0", "measured": 0.5,
                      "ci": [0.45, 0.55], "n": 5, "unit": "whole runs"}]}))
    (tmp_path / "ch05.json").write_text(json.dumps({
        "measurements": {"c8": [{"batch": 1, "step_ms": 8.0}, {"batch": 32, "step_ms": 40.0}]},
        "verdicts": [{"metric": "throughput of continuous batching / sequential at saturation (x)",
                      "measured": 1.9, "ci": [1.7, 2.1], "n": 5, "unit": "whole runs"}]}))
    return tmp_path


def test_factors_come_from_the_chapters_and_the_model_from_them(tmp_path):
    rows = {r["row"]: r for r in why.factors(_study(tmp_path))}
    e = rows["eagle"]
    assert (e["tau"], e["rows"], e["drafts"], e["c"], e["v"]) == (1.7, 17, 5.0, 0.6, 3.3)
    assert e["model"] == pytest.approx(1.7 / (3.3 + 3.0)) and e["measured"]["measured"] == 0.5
    b = rows["batching"]
    assert b["v"] == 5.0 and b["model"] == pytest.approx(32 / 5.0) and b["measured"]["measured"] == 1.9
    assert why.factors(tmp_path / "nothing") == []


def test_when_puts_a_gpu_roofline_beside_this_machine_and_labels_it_a_model(tmp_path):
    table = {"entries": [], "hardware": [{"name": "H100 SXM", "peak_tflops": 989.4, "bandwidth_tbs": 3.35,
                                          "source": "NVIDIA 'H100 datasheet'", "url": "https://nvidia.example"}]}
    rows = why.when(_study(tmp_path), table)
    gpu = [r for r in rows if r["where"].startswith("H100")]
    assert {r["row"] for r in gpu} == {"eagle", "batching"} and all("a model" in r["where"] for r in gpu)
    eagle = next(r for r in gpu if r["row"] == "eagle")
    assert eagle["v"] == 1.0 and eagle["model"] == pytest.approx(1.7 / (1 + 5 * 0.6))
    html = why.block(tmp_path, table)
    assert "tau / (v(rows verified) + draft forwards" in html and "(a model)" in html and "0.50x [0.45, 0.55]" in html
    assert "<a href='https://nvidia.example'>H100 datasheet</a>" in html  # the roofline's source is cited
    assert "Why, in one line" in why.one_line(tmp_path) and "v = 3.30" in why.one_line(tmp_path)


def test_the_committed_published_table_is_complete_and_cited():
    table = why.published()
    assert len(table["entries"]) >= 6
    for e in table["entries"]:
        assert e["url"].startswith("http") and e["source"] and e["hardware"] and e["model"]
    assert {h["name"] for h in table["hardware"]} and all(h["source"] for h in table["hardware"])


def test_a_bad_published_table_is_refused_with_what_is_missing(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("entries:\n  - {method: eagle, quantity: tau, value: 3.0}\n")
    with pytest.raises(StudylibError, match="lacks condition"):
        why.published(bad)
    bad.write_text("entries:\n  - {method: eagle, quantity: wow, value: 3.0, condition: c, hardware: h, model: m,"
                   " baseline: b, source: s, url: u}\n")
    with pytest.raises(StudylibError, match="quantity 'wow'"):
        why.published(bad)


def test_a_chapter_missing_fields_or_holding_nulls_leaves_its_row_out_and_never_raises(tmp_path):
    (tmp_path / "ch02.json").write_text(json.dumps({
        "params": {"headline": "eagle@5,4,16"},
        "measurements": {"eagle_trees": [{"method": "eagle@5,4,16", "tau": 1.7, "c": None, "v": 3.3}]},
        "verdicts": [{"metric": "wall-clock speedup over AR, eagle@5,4,16, T=0", "measured": 0.5, "ci": [None, None]}]}))
    (tmp_path / "ch05.json").write_text(json.dumps({"measurements": {"c8": [
        {"batch": None, "step_ms": 8.0}, {"batch": 1, "step_ms": 0.0}, {"batch": 8, "step_ms": 20.0}]}}))
    (tmp_path / "ch01.json").write_text(json.dumps({"measurements": {"ar_bench": {"dense": {
        "speedup_vs_hf": {"value": 1.04, "ci_low": None, "ci_high": None, "n": 3}, "hf_tok_s": {"value": 17.9},
        "studylib_tok_s": {"value": 18.5}}}}}))
    assert why.factors(tmp_path) == []
    assert why.block(tmp_path, {"entries": [], "hardware": []}) == ""
    assert "1.04x HF (n=3 prompts)" in why.baseline(tmp_path)
    assert why._measured({"measured": 0.5, "ci": [None, None], "n": 5}) == "0.50x (n=5)"


def test_a_survey_value_stands_beside_the_method_it_measured_only(tmp_path):
    entry = {"quantity": "speedup", "value": 1.4, "condition": "EAGLE was slower here", "hardware": "A100",
             "model": "m", "baseline": "AR", "source": "s <b>", "url": "https://x"}
    table = {"entries": [{**entry, "method": "spec_bench", "measures": "lookahead"}], "hardware": []}
    assert why._peers(table, "lookahead") and not why._peers(table, "eagle")
    assert "s &lt;b&gt;" in why._cite(table["entries"][0]) and "<b>" not in why._cite(table["entries"][0])


def test_a_published_value_that_is_not_a_number_is_refused(tmp_path):
    bad = tmp_path / "p.yaml"
    base = "condition: c, hardware: h, model: m, baseline: b, source: s, url: u"
    for value in ("'2.5'", "[1, 2, 3]", "[3, 1]"):
        bad.write_text(f"entries:\n  - {{method: eagle, quantity: tau, value: {value}, {base}}}\n")
        with pytest.raises(StudylibError, match="not a number or a"):
            why.published(bad)
    bad.write_text("entries: []\nhardware:\n  - {name: X, peak_tflops: 1}\n")
    with pytest.raises(StudylibError, match="hardware 0 lacks bandwidth_tbs, source, url"):
        why.published(bad)


def test_the_baseline_names_each_engine_with_its_arithmetic(tmp_path):
    """The headline ratios use the GGUF weights in int8 arithmetic; chapter 1 benchmarks that engine against
    HF generate too, and the front page names it with its arithmetic."""
    from studylib.bench.ar_bench import split_engine
    from studylib.experiments.ch01_report import engine_words

    assert split_engine("gguf") == ("gguf", "fp32") and split_engine("gguf@int8") == ("gguf", "int8")
    # the chapter's dtype is its dense model's: a block format loads in fp32 whatever it is (the bf16 exercise)
    from studylib.bench.ar_bench import engine_dtype

    assert [engine_dtype(w, "bfloat16") for w in ("dense", "gguf", "gguf@int8")] == ["bfloat16", "float32", "float32"]
    assert engine_words("gguf@int8").endswith("in int8 arithmetic") and "arithmetic" not in engine_words("gguf")
    est = {"value": 2.1, "ci_low": 2.0, "ci_high": 2.3, "n": 3}
    (tmp_path / "ch01.json").write_text(json.dumps({"measurements": {"ar_bench": {
        "gguf": {"speedup_vs_hf": est, "hf_tok_s": {"value": 20.0}, "studylib_tok_s": {"value": 42.0}},
        "gguf@int8": {"speedup_vs_hf": {**est, "value": 3.2}, "hf_tok_s": {"value": 20.0},
                      "studylib_tok_s": {"value": 64.0}}}}}))
    text = why.baseline(tmp_path)
    assert "on gguf weights our AR decoder runs at 42.0" in text
    assert "on gguf weights, int8 arithmetic our AR decoder runs at 64.0" in text and "3.20x HF" in text
    assert "HF's own speed differs" not in text  # one HF speed on both rows: nothing to explain
    data = json.loads((tmp_path / "ch01.json").read_text())
    data["measurements"]["ar_bench"]["gguf"]["hf_tok_s"]["value"] = 24.9
    (tmp_path / "ch01.json").write_text(json.dumps(data))
    assert "HF's own speed differs between the rows (20.0 to 24.9 tok/s)" in why.baseline(tmp_path)


def test_citations_read_as_words_and_are_cut_between_words():
    long = "NVIDIA H100 Tensor Core GPU datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, 3.35 TB/s"
    cut = why._title(long)
    assert cut.endswith("…") and "1,97…" not in cut and len(cut) <= 61 and long.startswith(cut[:-1])
    assert why._title("Li, Y. et al., 'EAGLE', ICML 2024") == "EAGLE" and why._title("short source") == "short source"
    unstated = "not stated in the retrieved passage"
    e = {"quantity": "throughput_gain", "value": [14, 24], "baseline": "HF", "model": unstated, "hardware": unstated,
         "source": "a source", "url": "https://example.org"}
    text = why._cite(e)
    assert text.startswith("throughput gain 14-24 vs HF (model and hardware not stated") and text.count(unstated) == 1
    assert f"LLaMA-7B, hardware {unstated}" in why._cite({**e, "model": "LLaMA-7B"})


def test_the_sweeps_model_is_named_in_words(tmp_path):
    cell = tmp_path / "sweeps" / "s" / "ch01-model=random_big" / "ch01.json"
    cell.parent.mkdir(parents=True)
    cell.write_text(json.dumps({"params": {"model": "random:big"}, "measurements": {"step_vs_rows": [
        {"engine": "q4_1 int8", "rows": 1, "ms": 50.0, "v": 1.0}, {"engine": "q4_1 int8", "rows": 32, "ms": 200.0, "v": 4.0}]}}))
    assert why._sweep_v(tmp_path, 32) == ("random weights at big's shapes", 4.0)
