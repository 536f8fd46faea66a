"""The shared figure style: stable colours per method, CI bands, roofline, number formatting."""

import matplotlib
import pytest

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


def test_roofline_names_points_that_crowd_under_the_roof_apart():
    # Chapter 1's shape: batch 16 and batch 32 sit a few pixels apart near the ridge; names placed at one
    # fixed offset collided there (the figure check caught it on the committed run).
    from studylib.workbook.figure_check import figure_defects

    points = [{"label": f"batch {b}", "intensity": i, "gflops": g} for b, i, g in
              [(1, 0.51, 7.1), (2, 1.01, 11.8), (4, 1.98, 19.1), (8, 3.82, 31.5), (16, 7.05, 47.7),
               (32, 12.3, 57.9)]]
    fig, ax = plt.subplots(figsize=(7, 4))
    plots.roofline(ax, 28.7, 266.0, points)
    plots.tidy(fig)
    assert len(ax.collections) == 6
    assert figure_defects(fig) == []
    plt.close("all")


def test_numbers_read_well():
    assert [plots.fmt_number(x) for x in (1397.3, 52.904, 0.0029812, 2039.0, 16, "a")] == [
        "1397", "52.9", "0.00298", "2039", "16", "a"]
    html = plots.table(pd.DataFrame({"a": [1.23456]})).to_html()
    assert "1.23" in html and "1.23456" not in html
    # through the one formatting layer: readable headers, no positional index, no printed tuple headers
    df = pd.DataFrame({"step_ms_low": [1.0], "step_ms": [2.0], "step_ms_high": [3.0], "ok": [True]}, index=[7])
    html = plots.table(df).to_html()
    assert "Step (ms) (95% CI)" in html and "step_ms_low" not in html and ">yes<" in html and ">7<" not in html
    wide = pd.DataFrame({("ms", "dense"): [1.0], ("rows", ""): [2]})
    html = plots.table(wide).to_html()
    assert "Ms dense" in html and "(&#x27;ms&#x27;" not in html and "('ms'" not in html


def _labels(axis) -> list[str]:
    lo, hi = sorted(axis.get_view_interval())
    return [axis.get_major_formatter()(v, i) for i, v in enumerate(axis.get_majorticklocs()) if lo <= v <= hi]


def test_log_axis_within_one_decade_gets_several_plain_labels():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [0.31, 0.45, 0.62])
    ax.set_yscale("log")
    fig.canvas.draw()
    assert len([t for t in _labels(ax.yaxis) if t]) < 3  # matplotlib alone: one label or none
    plots.tidy(fig)
    labels = [t for t in _labels(ax.yaxis) if t]
    assert len(labels) >= 3 and all("^" not in t and "e" not in t for t in labels)
    # a narrow range (under 1.3x) falls back to plain evenly spaced values
    fig2, ax2 = plt.subplots()
    ax2.plot([1, 2], [1.01, 1.2])
    ax2.set(yscale="log", ylim=(1.0, 1.25))
    plots.tidy(ax2)
    assert len([t for t in _labels(ax2.yaxis) if t]) >= 2
    # wide ranges keep matplotlib's decades
    fig3, ax3 = plt.subplots()
    ax3.plot([1, 2], [0.01, 100])
    ax3.set_yscale("log")
    before = list(ax3.yaxis.get_major_locator().tick_values(0.01, 100))
    plots.tidy(fig3)
    assert list(ax3.yaxis.get_major_locator().tick_values(0.01, 100)) == before
    plt.close("all")


def test_legend_over_the_data_moves_outside_and_one_clear_of_it_stays():
    import numpy as np

    fig, ax = plt.subplots()
    x = np.linspace(0, 1, 50)
    ax.plot(x, np.ones_like(x) * 0.95, label="top line")  # runs under the upper-right corner
    ax.plot(x, x * 0.1, label="bottom")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper right")
    assert plots.legend_covers_data(ax)
    plots.tidy(fig)
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["top line", "bottom"]  # same entries
    assert not plots.legend_covers_data(ax)  # moved to a place that covers nothing

    fig2, ax2 = plt.subplots()
    ax2.plot(x, x * 0.1, label="low")
    ax2.set_ylim(0, 1)
    ax2.legend(loc="upper right")
    assert not plots.legend_covers_data(ax2)
    plots.tidy(fig2)
    fig2.canvas.draw()
    assert ax2.get_legend().get_window_extent().x1 <= ax2.bbox.x1 + 1  # left where it was
    plt.close("all")


def test_a_legend_moved_off_the_data_never_lands_on_the_next_panel():
    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    x = np.linspace(0, 1, 50)
    for ax in (a, b):  # data along the top and bottom of both panels: no free corner inside
        ax.plot(x, np.full_like(x, 0.95), label="top")
        ax.plot(x, np.full_like(x, 0.05), label="bottom")
        ax.plot(np.full(50, 0.5), np.linspace(0, 1, 50), label="middle")
        ax.set(xlim=(0, 1), ylim=(0, 1))
    a.legend(loc="upper right")
    assert plots.legend_covers_data(a)
    plots.tidy(fig)
    fig.canvas.draw()
    box = a.get_legend().get_window_extent()
    assert not plots.legend_covers_data(a)
    assert not b.bbox.overlaps(box)  # beside the left panel would sit on the right one: it went under it
    plt.close("all")


def test_a_free_corner_is_preferred_and_tidy_on_one_axes_leaves_the_others():
    import numpy as np

    fig, (a, b) = plt.subplots(1, 2)
    x = np.linspace(0, 1, 50)
    a.plot(x, 0.9 * x + 0.05, label="rising")  # occupies the upper right and lower left
    a.set(xlim=(0, 1), ylim=(0, 1))
    a.legend(loc="upper right")
    b.plot([1, 2], [0.3, 0.6])
    b.set_yscale("log")
    plots.tidy(a)
    fig.canvas.draw()
    assert not plots.legend_covers_data(a) and a.get_legend().get_window_extent().x1 <= a.bbox.x1 + 1
    assert b.yaxis.get_major_locator().__class__.__name__ != "FixedLocator"  # b was not given to tidy
    plt.close("all")


def test_ticks_set_on_purpose_are_kept_and_a_seaborn_grid_is_accepted():
    import seaborn as sns

    fig, ax = plt.subplots()
    ax.plot([1, 2], [0.3, 0.6])
    ax.set_yscale("log")
    ax.set_yticks([0.3, 0.6], labels=["low", "high"])
    plots.tidy(fig)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["low", "high"]
    grid = sns.relplot(data=pd.DataFrame({"x": [1, 2, 3], "y": [0.3, 0.45, 0.6], "k": ["a", "a", "b"]}),
                       x="x", y="y", col="k", kind="line")
    for g_ax in grid.axes.flat:
        g_ax.set_yscale("log")
    assert plots.tidy(grid) is grid
    assert len([t for t in _labels(grid.axes.flat[0].yaxis) if t]) >= 3
    plt.close("all")


def test_a_family_palette_gives_each_member_its_own_shade_and_legends_go_below():
    pal = plots.family_palette(["dense", "quest:budget=1024", "quest:budget=2048", "window:64"],
                               lambda s: s.split(":")[0])
    assert len(set(pal.values())) == 4 and pal["dense"] == plots.color("dense")
    fig, axes = plt.subplots(1, 2)
    axes[0].plot([0, 1], [0, 1], label="window:1024 a long label")
    axes[0].legend()
    plots.legend_below(fig, axes[0])
    assert axes[0].get_legend() is None and len(fig.legends) == 1
    plt.close("all")


def test_point_labels_do_not_overlap():
    fig, ax = plt.subplots(figsize=(5, 3))
    pts = [(f"arm{i}", 2.0 + 0.01 * i, 1e-3 * (1 + 0.01 * i)) for i in range(5)]  # five points on one spot
    for _, x, y in pts:
        ax.plot(x, y, "o")
    ax.set_yscale("log")
    plots.label_points(ax, pts)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for t in ax.texts]
    assert len(boxes) == 5
    assert sum(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:]) == 0
    plt.close("all")


def test_point_labels_keep_off_the_title_the_axis_labels_and_out_of_the_edges():
    # A real run drew a name over the axes title: its point sat at the top edge, right under the title, and
    # only the other names were kept clear of. Here three crowd there, one sits in each corner, and a note
    # put on the axes before holds the middle.
    from studylib.workbook.figure_check import figure_defects

    fig, ax = plt.subplots(figsize=(5, 3))
    pts = [(f"config {i}", 4.0 + 0.1 * i, 10.0 - 0.1 * i) for i in range(3)]
    pts += [("top right", 10.0, 10.0), ("top left", 0.0, 10.0), ("bottom left", 0.0, 0.0), ("middle", 5.0, 4.6),
            ("bottom right", 10.0, 0.0)]
    for _, x, y in pts:
        ax.plot(x, y, "o", clip_on=False)
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    ax.set_title("throughput against latency")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("tokens / s")
    note = ax.text(5, 5, "a note placed before", ha="center")
    plots.label_points(ax, pts)
    assert len(ax.texts) == len(pts) + 1
    assert figure_defects(fig) == []  # no text within 2 px of another: title, axis and tick labels, names
    r = fig.canvas.get_renderer()
    frame = ax.get_window_extent(r)
    for t in ax.texts:
        if t is not note:
            b = t.get_window_extent(r)
            assert frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1, t.get_text()
    plt.close("all")


def test_a_palette_never_gives_two_names_one_colour():
    from studylib import plots

    names = ["system_prompt", "few_shot", "multi_turn", "tree_of_thought", "no_sharing", "speculative", "ar"]
    pal = plots.palette(names)
    assert list(pal) == names and len(set(pal.values())) == len(names)
    assert pal["speculative"] == plots.PALETTE["speculative"] and pal["ar"] == plots.PALETTE["ar"]
    assert plots.palette(names) == pal  # stable


def test_a_legend_below_sits_under_the_axis_labels():
    import matplotlib.pyplot as plt

    from studylib import plots
    from studylib.workbook.figure_check import figure_defects

    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    for ax in axes:
        for k in range(7):
            ax.plot([1, 2, 4], [k, k + 1, k + 3], label=f"pattern {k} / masked")
        ax.set_xlabel("sequence length (tokens)")
    plots.legend_below(fig, axes[0])
    assert figure_defects(fig) == []
    plt.close(fig)


def test_every_workload_keeps_one_colour_of_its_own():
    """A workload reads the same colour in every chapter's figure: each has a fixed colour, no two alike,
    none a method's."""
    from studylib.experiments.ch07_combined import WORKLOADS as STACKED
    from studylib.workloads.prefix import WORKLOADS as SHARING

    names = [*dict.fromkeys([*SHARING, *STACKED, "xsum", "narrativeqa", "humaneval"])]
    assert all(n in plots.PALETTE for n in names), [n for n in names if n not in plots.PALETTE]
    colours = [plots.PALETTE[n] for n in names]
    methods = {v for k, v in plots.PALETTE.items() if k not in names}
    assert len(set(colours)) == len(colours) and not set(colours) & methods
    assert plots.palette(["multi_turn", "ar"])["multi_turn"] == plots.palette(["xsum", "multi_turn"])["multi_turn"]


def test_a_legend_below_keeps_the_entries_of_a_legend_built_from_stand_in_handles():
    """A key of colours (handles drawn nowhere, as the front page's verdict key) survives the move."""
    import matplotlib.pyplot as plt

    from studylib import plots

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    keys = [plt.Line2D([], [], marker="o", ls="", color=c, label=k) for k, c in (("holds", "g"), ("fails", "r"))]
    ax.legend(handles=keys)
    plots.legend_below(fig, ax)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["holds", "fails"]
    plt.close(fig)


@pytest.mark.parametrize("rates", [[0.5], [0.5, 1.0, 2.0]])
@pytest.mark.parametrize("scale", [0.02, 0.6, 3.0])
def test_the_capacity_figure_names_its_slo_clear_of_the_title_wherever_the_probes_sit(rates, scale):
    """Chapter 5's smoke run, one probe under the SLO, drew 'SLO' over the panel's title; the name now sits
    inside the axes under the line, however many probes there are and whichever side of the line they fall."""
    from studylib.experiments.ch05_figures import plot_capacity
    from studylib.workbook.figure_check import figure_defects

    n = len(rates)
    probes = pd.DataFrame({"rate": rates, "ttft_p99_s": [0.5 * scale * (i + 1) for i in range(n)],
                           "tpot_p99_s": [0.05 * scale * (i + 1) for i in range(n)],
                           "met": [scale < 1] * n, "arm": "continuous+radix"})
    fig = plot_capacity(probes, {"ttft_s": 0.5, "tpot_s": 0.05})
    assert figure_defects(fig) == []
    plt.close(fig)


def test_a_short_log_axis_gets_ticks_whose_labels_cannot_overlap():
    """A log axis under a decade (here 40 to 110 tokens/s) gets every-integer ticks, which crowd the top of
    the decade (90 beside 100); they are thinned to an eighth of the axis apart, keeping at least three."""
    import math

    import matplotlib.pyplot as plt

    from studylib import plots

    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot([1, 2, 4], [40, 80, 110])
    ax.set_yscale("log")
    ax.set_ylim(40, 110)
    plots.readable_log_axis(ax.yaxis)
    ticks = [t for t in ax.get_yticks() if 40 <= t <= 110]
    gaps = [math.log10(b / a) for a, b in zip(ticks, ticks[1:], strict=False)]
    assert len(ticks) >= 3 and min(gaps) >= math.log10(110 / 40) / 8 - 1e-12
    plt.close(fig)
