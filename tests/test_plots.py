"""The shared figure style: stable colours per method, CI bands, roofline, number formatting."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from studylib import plots  # noqa: E402


def test_method_colours_are_fixed_and_distinct():
    plots.setup()
    assert plots.color("speculative") == plots.PALETTE["speculative"]
    assert plots.color("my-new-method") == plots.color("my-new-method")  # stable for unknown names
    pal = plots.palette(["ar", "speculative", "ar"])
    assert list(pal) == ["ar", "speculative"] and pal["ar"] != pal["speculative"]


def test_lineplot_ci_draws_precomputed_bands_and_roofline_draws_points():
    df = pd.DataFrame({"batch": [1, 2, 4] * 2, "ms": [1, 1.1, 1.3, 2, 2.1, 2.5], "lo": [0.9] * 6,
                       "hi": [3.0] * 6, "method": ["ar"] * 3 + ["speculative"] * 3})
    ax = plots.lineplot_ci(df, "batch", "ms", hue="method", low="lo", high="hi", logx=True)
    assert len(ax.lines) == 2 and len(ax.collections) == 2  # one line and one band per method
    fig, ax = plt.subplots()
    plots.roofline(ax, 10.0, 100.0, [{"intensity": 0.5, "gflops": 3.0, "label": "batch 1"}])
    assert len(ax.collections) == 1 and "10 GB/s" in ax.get_title()
    plt.close("all")


def test_numbers_read_well():
    assert [plots.fmt_number(x) for x in (1397.3, 52.904, 0.0029812, 2039.0, 16, "a")] == [
        "1397", "52.9", "0.00298", "2039", "16", "a"]
    html = plots.table(pd.DataFrame({"a": [1.23456]})).to_html()
    assert "1.23" in html and "1.23456" not in html
