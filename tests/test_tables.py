"""The one formatting layer for tables: readable headers with units, no index, three significant figures,
"not measured" for NaN/None, value and CI in one cell, nothing truncated."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from studylib.workbook.tables import NOT_MEASURED, header, install, number, readable, to_html


@pytest.mark.parametrize(("name", "text"), [
    ("throughput_tok_s", "Throughput (tok/s)"), ("ttft_p99_s", "TTFT p99 (s)"), ("kv_budget_mib", "KV budget (MiB)"),
    ("step_ms", "Step (ms)"), ("arm", "Arm"), ("e2el_p50_s", "End-to-end latency p50 (s)"),
    ("requests_per_s", "Requests per second"),  # once "Requests per (s)"
    ("tv_bound", "TV bound"), ("chi2_p", "χ² p"), ("mdc", "Minimum detectable change"), ("top1", "Top-1"),
    ("v", "v"), ("c", "c"), ("kv_kib_per_token", "KV KiB per token"),
    # a pivoted column: the quantity's header, then the arm in words, a block format whole
    ("tokens_s:dense_perop", "Tokens/s, dense (per-op path)"),  # once "Tokens s:dense per op"
    ("speedup:q8_0", "Speedup, q8_0"),  # once "Speedup:q8 0"
    ("mc_error", "Monte Carlo error"), ("tokens_per_step_mc", "Tokens per step (Monte Carlo)"),
])
def test_headers_read_as_words_with_units(name, text):
    assert header(name) == text


@pytest.mark.parametrize(("x", "text"), [
    (1.61234, "1.61"), (0.000123456, "0.000123"), (2.0, "2"), (123456.7, "123,457"), (float("nan"), NOT_MEASURED),
    (12.345, "12.3"), (-0.5, "-0.5"), (math.inf, "∞"),
])
def test_three_significant_figures(x, text):
    assert number(x) == text


def test_ci_columns_merge_into_one_cell_with_n_and_no_index():
    df = pd.DataFrame({"method": ["ar", "pld"], "prompts": [10, 10], "speedup": [1.0, 1.61234],
                       "speedup_low": [1.0, 1.0], "speedup_high": [1.0, 3.951], "exact": [True, False],
                       "note": [None, np.nan], "estimate": [object(), object()]}, index=[5, 9])
    out = readable(df.reset_index(drop=True))
    assert list(out.columns) == ["Method", "Prompts", "Speedup (95% CI, n)", "Exact", "Note"]
    assert out.iloc[1].tolist() == ["pld", "10", "1.61 (1-3.95, n=10)", "no", NOT_MEASURED]
    html = to_html(df.reset_index(drop=True))
    assert "NaN" not in html and "None" not in html and "..." not in html and "<th></th>" not in html


def test_a_labelled_index_becomes_a_column():
    df = pd.DataFrame({"throughput_tok_s": [1.5]}, index=pd.Index(["chat"], name="workload"))
    assert list(readable(df).columns) == ["Workload", "Throughput (tok/s)"]


def test_long_text_is_never_cut():
    long = "x" * 500
    html = to_html(pd.DataFrame({"conditions": [long]}))
    assert long in html


def test_install_outside_a_kernel_is_a_no_op_but_lifts_truncation():
    assert install() is False
    assert pd.get_option("display.max_colwidth") is None


def test_frame_from_pandas_html_round_trips_and_refuses_other_markup():
    from studylib.workbook.tables import frame_from_html

    df = pd.DataFrame({"arm": ["a", "b"], "x": [1.5, None], "ok": [True, False]})
    back = frame_from_html(df.to_html())
    assert back["arm"].tolist() == ["a", "b"] and back["ok"].tolist() == [True, False]
    assert back["x"].iloc[0] == 1.5 and pd.isna(back["x"].iloc[1])
    named = frame_from_html(df.set_index("arm").to_html())
    assert list(named.columns) == ["arm", "x", "ok"]
    two_level = pd.DataFrame([[1, 2]], columns=pd.MultiIndex.from_tuples([("a", "b"), ("a", "c")]))
    assert frame_from_html(two_level.to_html()) is None
    assert frame_from_html("<p>no table</p>") is None


def test_why_not_measured_is_printed_under_the_table_for_columns_that_are_empty():
    import math

    import pandas as pd

    from studylib.workbook import tables

    df = pd.DataFrame({"method": ["ar", "spec"], "alpha": [math.nan, 0.7], "tau": [1.0, 2.1],
                       "options": ["", "gamma=4"]})
    plain = tables.to_html(df)
    assert "not measured" in plain and "Not measured</i>:" not in plain  # no reason recorded, no note
    tables.why_not_measured(df, alpha="plain decoding drafts nothing", tau="never printed: tau has no gap")
    html = tables.to_html(df)
    assert "Not measured</i>: Alpha: plain decoding drafts nothing." in html
    assert "tau has no gap" not in html  # only columns that really have an empty cell are explained
    assert "–" in html and tables.readable(df)["Options"].tolist() == ["–", "gamma=4"]
    # the reason travels with the frame through the usual selections
    assert "drafts nothing" in tables.to_html(df[["method", "alpha"]].copy())


def test_empty_strings_in_rendered_html_are_values_not_missing_measurements():
    import pandas as pd

    from studylib.workbook import tables

    markup = pd.DataFrame({"a": ["", "x"], "b": [None, 1.5]}).to_html()
    back = tables.frame_from_html(markup)
    assert back["a"].tolist() == ["", "x"] and pd.isna(back["b"].iloc[0])


def test_columns_sharing_a_reason_are_named_together_and_cells_holding_lists_are_values():
    import math

    import numpy as np
    import pandas as pd

    from studylib.workbook import tables

    df = pd.DataFrame({"arm": ["a", "b"], "task_score": [math.nan, 0.5], "task_ratio": [math.nan, 1.0],
                       "ci": [(0.9, 1.1), None], "ids": [np.arange(3), np.arange(2)]})
    tables.why_not_measured(df, task_score="no references", task_ratio="no references", ci="one repeat only")
    assert tables.notes(df) == ["Task score, Task ratio: no references", "CI: one repeat only"]
    assert "Not measured</i>: Task score, Task ratio: no references; CI: one repeat only." in tables.to_html(df)


def test_unnamed_row_labels_get_a_blank_header_never_index():
    import pandas as pd

    from studylib.workbook.tables import readable

    t = pd.DataFrame({"workload": ["a", "b"], "hit rate": [0.5, 0.25]}).set_index("workload").T
    out = readable(t)
    assert list(out.columns) == ["", "A", "B"] and out.iloc[0, 0] == "hit rate"


@pytest.mark.parametrize("n, word, many, want", [
    (1, "layer", None, "1 layer"), (2, "layer", None, "2 layers"), (1.0, "repeat", None, "1 repeat"),
    (0, "prompt", None, "0 prompts"), (2.5, "token", None, "2.5 tokens"), (3, "query", "queries", "3 queries"),
])
def test_plural_puts_the_noun_in_the_number_of_the_count(n, word, many, want):
    from studylib.workbook.tables import plural

    assert plural(n, word, many) == want


def test_span_reads_as_one_value_when_both_ends_print_the_same():
    from studylib.workbook.tables import span

    assert span(1.0, 0.9999) == "100%" and span(0.92, 0.97) == "92%-97%" and span(0.5, 0.75, ".2f") == "0.50-0.75"


def test_a_corrected_level_in_the_frame_names_the_ci_headers():
    """Chapter 8's speed table carried 99.38% CIs under '(95% CI, n)' headers and a 'Confidence 0.994' column."""
    import pandas as pd

    df = pd.DataFrame({"arm": ["a", "b"], "speedup": [1.2, 1.4], "speedup_low": [1.1, 1.3],
                       "speedup_high": [1.3, 1.5], "confidence": [1 - 0.05 / 8] * 2})
    out = readable(df)
    assert list(out.columns) == ["Arm", "Speedup (99.38% CI)"]
    assert list(readable(df.drop(columns=["confidence"])).columns) == ["Arm", "Speedup (95% CI)"]
    mixed = readable(df.assign(confidence=[0.95, 0.99]))
    assert "Speedup (CI)" in mixed.columns and "Confidence" in mixed.columns


def test_a_pivoted_header_from_an_earlier_run_gets_its_words_on_the_page():
    from studylib.workbook.book import _readable_output

    out = {"data": {"text/html": "<table class='studylib-table'><tr><th>Tokens s:dense per op</th>"
                                 "<th>Speedup:q8 0</th><th>Arm</th></tr><tr><td>few_shot</td></tr></table>"}}
    _readable_output(out)
    page = out["data"]["text/html"]
    assert "<th>Tokens/s, dense (per-op path)</th>" in page and "<th>Speedup, q8_0</th>" in page
    assert "<th>Arm</th>" in page and "<td>few-shot</td>" in page


def test_the_appendix_prints_parameters_as_the_command_line_takes_them():
    from studylib.workbook.book import appendix

    page = appendix({"params": {"model": "smollm2-135m", "lengths": [8, 16], "budgets": {"ch01": 6}, "x": None},
                     "provenance": {}})
    assert "<code>smollm2-135m</code>" in page and "&quot;" not in page
    assert "<code>8, 16</code>" in page and "<code>ch01: 6</code>" in page and "<code>none</code>" in page
