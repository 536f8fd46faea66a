"""The rendered book: chapter pages open with their claims and computed summary, hide setup cells, link
to their neighbours, carry the CJK font; the front page is written from the verdicts. No execution:
the report folder is built by hand from tiny notebooks and judged verdicts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from studylib.claims import CLAIMS, decide_parts, judge_at_least, judge_at_most
from studylib.workbook import save_chapter
from studylib.workbook.assemble import build_book
from studylib.workbook.book import format_ci, is_setup_cell, settings_line, sig
from studylib.workbook.fonts import FONT_FAMILY, cjk_chars, covered_chars, project_chars


def _notebook(title: str, extra_md: str = "") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    imports = nbformat.v4.new_code_cell("import math\n\nimport pandas as pd\nfrom studylib import plots\n\nplots.setup()")
    params = nbformat.v4.new_code_cell('profile = "smoke"\nsecret_default = 1', metadata={"tags": ["parameters"]})
    injected = nbformat.v4.new_code_cell('# Parameters\nsecret_injected = 2', metadata={"tags": ["injected-parameters"]})
    work = nbformat.v4.new_code_cell("result = measure_things()")
    import numpy as np
    import pandas as pd

    raw = pd.DataFrame({"throughput_tok_s": [26.31234, np.nan], "speedup": [1.61, 2.0], "speedup_low": [1.0, 1.5],
                        "speedup_high": [3.95, 2.5]}).to_html()  # what a notebook displayed before the layer
    work.outputs = [nbformat.v4.new_output("display_data", data={"text/html": "<table><tr><td>42</td></tr></table>"}),
                    nbformat.v4.new_output("display_data", data={"text/html": raw})]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {title}\n\nWhat this chapter does."), imports, params, injected,
                nbformat.v4.new_markdown_cell("## A section\n\nThe word radix appears here. " + extra_md), work,
                nbformat.v4.new_markdown_cell("## Try this\n\nAn old, broken `-p 'sweep_gammas=[...]'`."),
                nbformat.v4.new_code_cell("from studylib.workbook.exercises import show_exercises\n\nshow_exercises(1)")]
    return nb


def _study(tmp_path):
    lat = judge_at_least("C7", "latency reduction", (3.0, 2.5, 3.5, 10), 10.0, ">10x", "cpu", 2, unit="requests")
    q = judge_at_least("C7", "quality retained", (0.9996, 0.9991, 1.0, 10), 0.99, ">99%", "cpu", 2, unit="prompts")
    save_chapter(2, "Combined", decide_parts("C7", "all at once", [q, lat], "", "cpu", 2), {}, tmp_path, declarations=None,
                 params={"model": "tiny", "dtype": "float32", "device": "cpu", "profile": "cpu"}, display=False)
    save_chapter(1, "Baseline", [judge_at_most("C1", "step time ratio", (1.2, 1.1, 1.3, 12), 2.0, "<=2", "cpu", 1,
                                               unit="prompts")],
                 {}, tmp_path, params={"model": "tiny", "device": "cpu", "profile": "cpu"}, display=False,
                 declarations=None)
    nbformat.write(_notebook("Chapter 1: the baseline", "原文"), str(tmp_path / "ch01.ipynb"))
    nbformat.write(_notebook("Chapter 2: combined"), str(tmp_path / "ch02.ipynb"))
    index = {"profile": "cpu", "chapters": {"1": {"status": "ok", "seconds": 75.0}, "2": {"status": "ok", "seconds": 12.0}}}
    build_book(tmp_path, index)
    return tmp_path


def test_chapter_page_opens_with_claim_and_computed_summary(tmp_path):
    out = _study(tmp_path)
    page = (out / "ch02.html").read_text(encoding="utf-8")
    title_at = page.index("Chapter 2: combined")
    summary_at = page.index("class='summary'")
    assert title_at < summary_at < page.index("What this chapter does.")  # the summary sits under the title
    assert CLAIMS["C7"].quote_zh[:10] in page and CLAIMS["C7"].text[:30] in page
    # the parts with CI and n, formatted by the library (four digits where three would print 1 to 1)
    assert "0.9996 (95% CI 0.9991 to 1, n=10 prompts)" in page
    assert "3 (95% CI 2.5 to 3.5, n=10 requests)" in page
    assert "does not hold" in page


def test_setup_cells_hidden_and_settings_in_appendix(tmp_path):
    out = _study(tmp_path)
    page = (out / "ch01.html").read_text(encoding="utf-8")
    assert "import math" not in page and "plots.setup" not in page
    assert "secret_default" not in page and "secret_injected" not in page
    # the work's output stays; its source (a call into the library) is in the notebook, not on the page
    assert "measure_things" not in page and "<td data-short>42</td>" in page
    assert "Run: tiny" in page and "profile cpu" in page
    assert page.index("Run: tiny") < page.index("A section")
    assert "<details class='appendix'>" in page and "Appendix: every parameter" in page


def test_try_this_comes_from_the_tested_exercises(tmp_path):
    out = _study(tmp_path)
    page = (out / "ch01.html").read_text(encoding="utf-8")
    assert "sweep_gammas=[...]" not in page and "show_exercises" not in page
    assert "studylib reproduce --profile class --chapters 1 --out /tmp/try01-halve-the-bytes -p dtype=bfloat16" in page
    assert "studylib reproduce --profile class --chapters 1 --out /tmp/try01-baseline" in page  # the unchanged run
    assert "Look for:" in page


def test_raw_pandas_tables_go_through_the_formatting_layer(tmp_path):
    out = _study(tmp_path)
    page = (out / "ch01.html").read_text(encoding="utf-8")
    page = re.sub(r"base64,[A-Za-z0-9+/=]+", "base64,", page)  # the inlined font and figures are not text
    assert "Throughput (tok/s)" in page and "26.3" in page and "not measured" in page
    assert "1.61 (1-3.95)" in page and "NaN" not in page and "throughput_tok_s" not in page


def test_cross_references_link_other_chapters_only_in_prose():
    from studylib.workbook.book import cross_reference

    md = "# Chapter 2: x\nAs chapter 1 shows, and Chapter 3 (not run); `chapter 1` in code; [chapter 1](x.html).\n"
    out = cross_reference(md, 2, [1, 2])
    assert "[chapter 1](ch01.html) shows" in out and "Chapter 3 (not run)" in out
    assert out.startswith("# Chapter 2: x") and "`chapter 1` in code" in out and "[chapter 1](x.html)" in out


def test_navigation_links_neighbours_and_contents(tmp_path):
    out = _study(tmp_path)
    one, two = (out / "ch01.html").read_text(encoding="utf-8"), (out / "ch02.html").read_text(encoding="utf-8")
    assert "href='ch02.html'" in one and "href='ch01.html'" not in one
    assert "href='ch01.html'" in two and "href='index.html'" in two
    book = (out / "book.html").read_text(encoding="utf-8")
    assert book.index("id='ch01'") < book.index("id='ch02'") and "<nav class='book" not in book


def test_front_page_written_from_verdicts(tmp_path, monkeypatch):
    from studylib import decisions

    # synthetic records have no registered declaration; the page's layout is what is tested here
    monkeypatch.setattr(decisions, "apply_registration", lambda data, path=None: data)
    out = _study(tmp_path)
    page = (out / "index.html").read_text(encoding="utf-8")
    # the verdicts first (a reader's first screen), then the setting
    order = ["The verdicts", "What the source document says", "What was run",
             "Claimed against measured", "The chapters", "Search the chapters", "Rerun it", "Every verdict"]
    at = [page.index(h if h == "Every verdict" else f"<h2>{h}") for h in order]
    assert at == sorted(at)
    assert "1 holds (C1), 1 does not hold (C7)" in page
    # C7's parts listed weakest first: the failing latency part before the quality part that holds
    assert page.index("latency reduction: 3") < page.index("quality retained: 0.9996")
    assert "1.2 min" in page and "12 s" in page
    assert (out / "claims_vs_measured.png").exists() and "src='claims_vs_measured.png'" in page
    checked = json.loads((out / "claims_vs_measured.figures.json").read_text())  # the figure check read it
    assert checked == {"figures": 1, "defects": []}, checked
    assert "the essay's own number where it gives one" in page and "bar this study chose" in page
    assert '"radix' not in page and "The word radix appears here." in page  # the search index, escaped JSON


def test_pages_carry_a_font_for_every_chinese_character(tmp_path):
    out = _study(tmp_path)
    covered = covered_chars()
    assert covered, "studylib/workbook/assets/cjk-subset.woff is missing"
    for name in ("index.html", "ch01.html", "ch02.html", "book.html"):
        text = (out / name).read_text(encoding="utf-8")
        assert f"font-family: '{FONT_FAMILY}'" in text and "data:font/woff;base64," in text
        missing = cjk_chars(text) - covered
        assert not missing, f"{name}: regenerate the font subset (python -m studylib.workbook.fonts): {missing}"


def test_font_subset_covers_every_chinese_character_in_the_sources():
    missing = project_chars() - covered_chars()
    assert not missing, ("the CJK subset lacks " + "".join(sorted(missing)) +
                         "; regenerate it: python -m studylib.workbook.fonts --source wqy-microhei.ttc")


@pytest.mark.parametrize(("value", "ci", "n", "text"), [
    (1.61, (1.0, 3.95), 10, "1.61 (95% CI 1 to 3.95, n=10)"),
    (0.99962, (0.99911, 1.0), 10, "0.9996 (95% CI 0.9991 to 1, n=10)"),
    (1.0, (1.0, 1.0), 10, "1 (95% CI 1 to 1, n=10)"),
    (123456.0, None, None, "123456"),
    ("2/4 hold", None, None, "2/4 hold"),
    (None, None, None, "not measured"),
])
def test_format_ci(value, ci, n, text):
    assert format_ci(value, ci, n) == text


def test_sig_never_scientific_for_study_magnitudes():
    assert sig(0.000123) == "0.000123" and sig(12345.6) == "12346" and sig(2.0) == "2" and sig(0.5) == "0.5"


def test_setup_cell_rule():
    cell = nbformat.v4.new_code_cell
    assert is_setup_cell(cell("import a\nfrom b import c\n\nplots.setup()"))
    assert is_setup_cell(cell("x = 1", metadata={"tags": ["parameters"]}))
    assert not is_setup_cell(cell("import a\nrun()\nmore()\nplot()"))
    assert is_setup_cell(cell("from a import (\n    b,\n    c,\n)\nimport d\nsetup()"))
    # a call spread over indented continuation lines is work, not setup
    assert not is_setup_cell(cell("import x\nverdicts = judge(a,\n    b,\n    c,\n    d)\nsave(verdicts)"))
    assert not is_setup_cell(nbformat.v4.new_markdown_cell("import this"))


def test_book_cli_without_a_run_is_one_line_and_exit_2(tmp_path, capsys):
    from studylib.cli import main

    assert main(["book", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no executed chapter" in err[0] and "studylib reproduce" in err[0]


def test_front_page_says_which_chapters_ran_on_which_machine(tmp_path):
    import json as _json

    from studylib.workbook import front

    def prov(cpu, isa):
        return {"cpu": cpu, "cpu_count": 2, "isa": {"label": isa}, "date": "2026-12-04T10:00:00+00:00",
                "git_commit": "a" * 40, "git_dirty": False, "versions": {"torch": "2.13.0+cpu"}}

    for ch, cpu, isa in ((1, "AMD EPYC", "avx512_bf16"), (2, "Intel Xeon", "amx_bf16"), (3, "AMD EPYC", "avx512_bf16")):
        (tmp_path / f"ch{ch:02d}.json").write_text(_json.dumps({"params": {"model": "m"}, "provenance":
                                                                prov(cpu, isa)}), encoding="utf-8")
    text = front.what_was_run(tmp_path, {"profile": "cpu", "chapters": {}})
    assert "chapters 1 and 3 on AMD EPYC (2 cores, ISA avx512_bf16)" in text
    assert "chapter 2 on Intel Xeon (2 cores, ISA amx_bf16)" in text
    (tmp_path / "ch02.json").unlink()
    assert "on AMD EPYC (2 cores, ISA avx512_bf16), profile" in front.what_was_run(tmp_path, {"profile": "cpu"})


def test_front_page_says_the_embedded_model_is_distributed_in_4_bit():
    from studylib.workbook.front import _native_format_note

    note = _native_format_note("smollm2-135m", compression_ran=True)
    assert "Q4_1" in note and "cannot be measured" in note and "chapter 8" in note
    assert "chapter 8" not in _native_format_note("smollm2-135m", compression_ran=False)
    assert _native_format_note("tiny-random", compression_ran=True) == ""  # no GGUF: nothing to say


def test_the_printed_book_opens_with_the_front_matter_and_wraps_wide_tables(tmp_path):
    """book.pdf's page 1 is the front page's verdicts, not a contents list; printed tables wrap instead of
    losing columns; the claims figure's labels keep their distinguishing end."""
    from studylib.workbook.book import PRINT_CSS, front_matter, write_print_page
    from studylib.workbook.front import shorten_middle

    (tmp_path / "index.html").write_text(
        "<html><body><h1>Study</h1><h2>The bottom line</h2><p>3 hold</p>"
        "<h2>The chapters</h2><table>chapters</table><h2>Sweeps</h2><p>the sweep</p>"
        "<h2>Search the chapters</h2><input id='search'><script>x</script>"
        "<h2 id='instrument'>The instrument card</h2><p>the card</p>"
        "<details class='all'><summary>Every verdict</summary><table>all rows</table></details></body></html>")
    (tmp_path / "ch01.html").write_text("<html><body><h1>Chapter 1</h1><p>body</p></body></html>")
    front = front_matter(tmp_path)
    assert "3 hold" in front and "chapters</table>" not in front and "id='search'" not in front
    # what a reader of paper needs stays: the sweeps, the card, and every verdict unfolded
    assert "the sweep" in front and "the card" in front and "<details class='all' open>" in front
    text = write_print_page(tmp_path, [(1, "Chapter 1")]).read_text()
    assert text.index("3 hold") < text.index("Contents") < text.index("<p>body</p>")
    # a printed cell may wrap inside a long word rather than overflow the page; test_book_pdf checks book.pdf
    assert "overflow-wrap: anywhere" in PRINT_CSS and "@media print" in text
    label = shorten_middle("C9 ch8: decode speed-up over dense fp32, same engine path, gguf+bf16prefill", 50)
    assert len(label) <= 50 and label.endswith("gguf+bf16prefill") and label.startswith("C9 ch8")


def test_every_page_names_the_commit_that_measured_it_and_the_one_that_rendered_it(tmp_path):
    from studylib.bench.provenance import git_state

    out = _study(tmp_path)
    head = git_state()[0][:12]
    for name in ("index.html", "ch01.html", "ch02.html"):
        text = (out / name).read_text()
        assert "measured at commit" in text, name
        assert text.count("class='rendered-from'") == 1 and f"rendered from commit <code>{head}" in text, name
    book = (out / "book.html").read_text()
    assert book.count("class='rendered-from'") == 1  # the pages it gathers do not bring theirs


def test_the_committed_front_page_figure_was_checked_and_is_clean():
    log = Path(__file__).resolve().parents[1] / "reports" / "cpu" / "claims_vs_measured.figures.json"
    assert log.exists(), "render the book (studylib book --profile cpu) so the front page's figure is checked"
    assert json.loads(log.read_text())["defects"] == []


def test_a_short_cell_is_marked_to_stay_on_one_line():
    from studylib.workbook.book import keep_short_cells

    html = "<tr><th>claim</th><td class='x'>q4_1</td><td>a longer cell</td><td>0.0748</td><td>averylongword</td></tr>"
    got = keep_short_cells(html)
    assert got == ("<tr><th data-short>claim</th><td class='x' data-short>q4_1</td><td>a longer cell</td>"
                   "<td data-short>0.0748</td><td>averylongword</td></tr>")
    assert keep_short_cells(got) == got  # marked once


@pytest.mark.parametrize("params, says", [
    ({"dtype": "float32", "device": "cpu"}, "float32 on cpu"),
    ({"dtype": "float32", "device": "cpu", "weights": "dense", "act": "fp32"}, "float32 on cpu"),
    # chapter 2 on the GGUF engine once read 'float32 on cpu' above conditions naming int8 activations
    ({"dtype": "float32", "device": "cpu", "weights": "gguf", "act": "int8"}, "gguf weights, int8 activations on cpu"),
])
def test_the_settings_line_names_the_arithmetic_the_run_used(params, says):
    line = settings_line({"params": params, "provenance": {}})
    assert says in line and ("float32" in says or "float32" not in line)


def test_a_corrected_ci_names_its_own_level_everywhere_it_is_printed():
    """Chapters 6 and 8 decide on Bonferroni-corrected CIs (98.33%, 99.38%); the box, the front page and
    the verdict tables once labelled them 95%."""
    from studylib.claims import format_measured

    assert format_ci(1.72, (1.70, 1.75), 10, confidence=1 - 0.05 / 3) == "1.72 (98.33% CI 1.7 to 1.75, n=10)"
    assert format_ci(1.72, (1.70, 1.75), 10) == "1.72 (95% CI 1.7 to 1.75, n=10)"
    assert format_measured(0.908, (0.886, 0.916), 48, 1 - 0.05 / 8) == "0.908 [0.886, 0.916] 99.38% CI (n=48)"
    assert format_measured(0.908, (0.886, 0.916), 48) == "0.908 [0.886, 0.916] (n=48)"


def test_a_run_line_without_one_arithmetic_leaves_no_empty_slot():
    line = settings_line({"params": {"device": "cpu", "threads": 2}, "provenance": {}})
    assert "Run: cpu · 2 threads" in line and " on cpu" not in line


def test_weakest_first_orders_a_verdict_by_how_far_its_ci_falls_short_of_its_bar():
    """The front page's C7 parts read 2.9 (bar 10), 3.22 (bar 8), 1.63 (bar 10) 'weakest first'."""
    from studylib.claims import PART, judge_at_least
    from studylib.workbook.book import weakest_first

    def est(value, lo, hi):
        return (value, lo, hi, 24)

    a = judge_at_least("C7", "latency", est(2.9, 2.77, 2.95), 10.0, "", "", 7, role=PART)
    b = judge_at_least("C7", "throughput", est(3.22, 2.85, 3.42), 8.0, "", "", 7, role=PART)
    c = judge_at_least("C7", "under load", est(1.63, 1.16, 2.24), 10.0, "", "", 7, role=PART)
    ok = judge_at_least("C7", "quality", est(1.0, 0.995, 1.0), 0.99, "", "", 7, role=PART)
    assert [v.metric for v in weakest_first([ok, a, b, c])] == ["under load", "latency", "throughput", "quality"]


def test_the_run_line_names_the_dot_product_path_of_int8_activations():
    line = settings_line({"params": {"weights": "gguf", "act": "int8", "device": "cpu"},
                          "provenance": {"cpu": "Xeon", "isa": {"label": "amx_bf16"}, "int8_kernel": "amx"}})
    assert "Xeon (ISA amx_bf16; int8 dot products on amx)" in line
    plain = settings_line({"params": {"dtype": "float32", "device": "cpu"},
                           "provenance": {"cpu": "Xeon", "isa": {"label": "amx_bf16"}, "int8_kernel": "amx"}})
    assert "Xeon (ISA amx_bf16)" in plain


def test_every_figure_gets_a_description_from_the_prose_that_introduces_it():
    import nbformat

    from studylib.workbook import book

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Chapter 9: Things"),
                nbformat.v4.new_markdown_cell("## 2. Step cost\n\nOne step of k rows, timed. More words here."),
                nbformat.v4.new_code_cell("plot()", outputs=[nbformat.v4.new_output(
                    "display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})]),
                nbformat.v4.new_code_cell("table()", outputs=[nbformat.v4.new_output(
                    "display_data", data={"text/plain": "x"})])]
    assert book.figure_captions(nb, "Chapter 9") == ["Figure in “2. Step cost”: One step of k rows, timed."]
    body = book._notebook_body(nb, 9)
    assert 'alt="Figure in “2. Step cost”: One step of k rows, timed."' in body
    assert book.NO_ALT not in body and "plot()" not in body  # the code cell's source is not on the page


def test_the_claims_figure_has_one_row_per_claim_and_chapter_with_the_part_that_decided_it():
    from studylib.claims import FAILS, HOLDS, Verdict
    from studylib.workbook.front import deciding_rows

    def row(i, ch, role, verdict, metric, value=None, bar=None, by_construction=False):
        return Verdict(i, "", metric, value, None if value is None else (value * 0.9, value * 1.1), "", verdict, "",
                       ch, n=10, threshold=bar, direction="at_least" if bar else "check", role=role,
                       by_construction=by_construction)

    vs = [row("C1", 1, "decision", FAILS, "d1"), row("C1", 1, "part", HOLDS, "fit", 1.2, 1.0),
          row("C1", 1, "part", FAILS, "weak", 0.5, 1.0), row("C1", 1, "part", FAILS, "weaker", 0.3, 1.0),
          row("C6", 6, "decision", HOLDS, "d6"), row("C6", 6, "part", HOLDS, "a", 1.5, 1.0),
          row("C6", 6, "part", HOLDS, "b", 3.0, 1.0), row("C6", 6, "part", HOLDS, "free", 9.0, 1.0, True),
          row("C8", 7, "decision", HOLDS, "d8"), row("C8", 7, "part", HOLDS, "a check")]
    got = [(d.id, p.metric) for d, p in deciding_rows(vs)]
    # the weakest failing part decides a failure; the holding part furthest past its bar carries a hold
    # (never one that holds by construction); a check-only claim is shown by its check
    assert got == [("C1", "weaker"), ("C6", "b"), ("C8", "a check")]
    # an exploratory decision reads inconclusive whatever its parts say: the figure shows the weakest
    # counted part, the one the claims table names (it once showed a check that held)
    from studylib.claims import INCONCLUSIVE

    vs4 = [row("C4", 4, "decision", INCONCLUSIVE, "d4"), row("C4", 4, "part", HOLDS, "identical"),
           row("C4", 4, "part", HOLDS, "lru", 0.98, 0.95), row("C4", 4, "part", FAILS, "clears", 0.5, 0.95)]
    assert [(d.id, p.metric) for d, p in deciding_rows(vs4)] == [("C4", "clears")]
    # a hold under conditions is carried by a configuration that holds: not by a part that holds inside a
    # failing configuration (kv_int8's quality, when its speed fails) nor inside one that is not counted
    from studylib.claims import CONDITIONAL

    vs9 = [row("C9", 8, "decision", CONDITIONAL, "d9"),
           row("C9", 8, "part", HOLDS, "q8_0: both"), row("C9", 8, "part", HOLDS, "speed, q8_0", 3.7, 2.0),
           row("C9", 8, "part", HOLDS, "quality, q8_0", 0.9986, 0.99),
           row("C9", 8, "part", FAILS, "kv_int8: both"), row("C9", 8, "part", FAILS, "speed, kv_int8", 0.9, 2.0),
           row("C9", 8, "part", HOLDS, "quality, kv_int8", 1.5, 0.99),
           row("C9", 8, "part", HOLDS, "gguf: both", by_construction=True),
           row("C9", 8, "part", HOLDS, "speed, gguf", 9.0, 2.0)]
    assert [(d.id, p.metric) for d, p in deciding_rows(vs9)] == [("C9", "speed, q8_0")]
    # a part that itself holds only under conditions gave a conditional decision its verdict (C4's eviction
    # ratio beside an exactness check that holds): the figure once plotted the check, the table the ratio
    vs4c = [row("C4", 4, "decision", CONDITIONAL, "d4"), row("C4", 4, "part", HOLDS, "identical", 1.0),
            row("C4", 4, "part", CONDITIONAL, "lru / belady", 0.98, 0.95)]
    assert [(d.id, p.metric) for d, p in deciding_rows(vs4c)] == [("C4", "lru / belady")]
    # an inconclusive decision is shown by the part the table calls weakest (the CI end nearest its bar),
    # not by the lowest point estimate: the two once named different quality rows for C6
    import dataclasses

    from studylib.workbook.book import weakest_first

    # chapter 6's quality rows: quest:2048 has the lower point, quest:1024 the lower bound
    q2048 = dataclasses.replace(row("C6", 6, "part", INCONCLUSIVE, "q2048", 1.0043, 0.99), ci=(0.9835, 1.025))
    q1024 = dataclasses.replace(row("C6", 6, "part", INCONCLUSIVE, "q1024", 1.0076, 0.99), ci=(0.9816, 1.034))
    vs6 = [row("C6", 6, "decision", INCONCLUSIVE, "d6"), q2048, q1024]
    assert deciding_rows(vs6)[0][1].metric == weakest_first([q2048, q1024])[0].metric == "q1024"


def test_the_claims_figure_has_one_row_per_claim_at_print_size(tmp_path):
    """A claim decided over two chapters is one row: the chapter whose decision took the study's verdict. The
    figure is saved at the width it prints at, so its 9 pt labels print at 9 pt."""
    from PIL import Image

    from studylib.claims import CONDITIONAL, FAILS, HOLDS, INCONCLUSIVE, Verdict
    from studylib.workbook.front import CLAIMS_FIGURE_IN, claim_rows, claims_figure

    def row(i, ch, role, verdict, metric, value=None, bar=None):
        return Verdict(i, "", metric, value, None if value is None else (value * 0.9, value * 1.1), "", verdict, "",
                       ch, n=10, threshold=bar, direction="at_least" if bar else "check", role=role)

    vs = [row("C3", 2, "decision", FAILS, "d2"), row("C3", 2, "part", FAILS, "speed ch2", 0.5, 1.0),
          row("C3", 3, "decision", INCONCLUSIVE, "d3"), row("C3", 3, "part", INCONCLUSIVE, "speed ch3", 0.97, 1.0),
          row("C8", 5, "decision", FAILS, "d5"), row("C8", 5, "part", FAILS, "tpot", 0.5, 1.0),
          row("C8", 7, "decision", HOLDS, "d7"), row("C8", 7, "part", HOLDS, "band", 1.2, 1.0)]
    got = [(d.id, d.verdict, p.metric) for d, p in claim_rows(vs)]
    assert got == [("C3", INCONCLUSIVE, "speed ch3"), ("C8", CONDITIONAL, "band")]
    path = claims_figure(vs, tmp_path / "c.png")
    with Image.open(path) as im:
        assert abs(im.size[0] / 110 - CLAIMS_FIGURE_IN) < 0.05  # saved at its print width


def test_the_claims_table_shows_the_number_of_the_chapter_whose_verdict_the_study_took():
    """C3 over chapters 2 (does not hold) and 3 (inconclusive) reads inconclusive: its "weakest part" is
    chapter 3's, not chapter 2's failing row under an inconclusive badge."""
    from studylib.claims import FAILS, INCONCLUSIVE, Verdict
    from studylib.workbook.front import claims_table

    def row(i, ch, role, verdict, metric, value=None, bar=None):
        return Verdict(i, "", metric, value, None if value is None else (value * 0.9, value * 1.1), "", verdict, "",
                       ch, n=10, threshold=bar, direction="at_least" if bar else "check", role=role)

    vs = [row("C3", 2, "decision", FAILS, "d2"), row("C3", 2, "part", FAILS, "speed ch2", 0.5, 1.0),
          row("C3", 3, "decision", INCONCLUSIVE, "d3"), row("C3", 3, "part", INCONCLUSIVE, "speed ch3", 0.97, 1.0)]
    page = claims_table(vs, {2: "two", 3: "three"})
    assert "speed ch3" in page and "speed ch2" not in page and "(chapter 3)" in page


def test_a_hold_is_shown_by_the_part_that_carried_it_not_by_one_that_failed():
    from studylib.claims import CONDITIONAL, FAILS, HOLDS, Verdict
    from studylib.workbook.front import claims_table

    def row(role, verdict, metric, value=None, bar=None):
        return Verdict("C6", "", metric, value, None if value is None else (value * 0.95, value * 1.05), "", verdict,
                       "", 6, n=10, threshold=bar, direction="at_least" if bar else "check", role=role)

    vs = [row("decision", CONDITIONAL, "d6"), row("part", HOLDS, "speed-up a", 1.6, 1.0),
          row("part", FAILS, "quality b", 0.9, 0.99)]
    page = claims_table(vs, {6: "six"})
    assert "carried by: speed-up a" in page and "quality b" not in page


def test_the_printed_edition_keeps_text_figures_and_verdicts_and_points_at_the_data_tables():
    from studylib.workbook.book import print_edition

    body = ("<p>prose</p><div class='same-kind'><div><p>other chapters</p></div></div>"
            "<div class='instrument'><table><tr><td>card</td></tr></table></div>"
            "<div class=\"output_area\"><div class=\"x\"><table class=\"dataframe\"><tr><td>data</td></tr></table>"
            "</div></div>"
            "<div class=\"output_area\"><div><table class=\"verdict-table\"><tr><td>verdict</td></tr></table></div></div>"
            "<div class=\"output_area\"><img src='a.png' alt='fig'></div><p>after</p>")
    out = print_edition(body, 3)
    assert "prose" in out and "after" in out and "verdict</td>" in out and "<img" in out
    assert "other chapters" not in out and "card</td>" not in out and "data</td>" not in out
    assert "in the HTML edition, <i>ch03.html</i>" in out and out.count("<div") == out.count("</div>")
