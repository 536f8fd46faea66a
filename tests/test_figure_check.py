"""The figure check finds each class of defect a reader would see, from matplotlib's bounding boxes, and
stays quiet on a clean figure; the hook that ``plots.setup`` installs logs every drawn figure; and the
committed study's figures carry a clean log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import seaborn as sns  # noqa: E402

from studylib.workbook.figure_check import LOG_ENV, figure_defects  # noqa: E402

REPORTS = Path(__file__).resolve().parents[1] / "reports" / "cpu"


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_a_clean_figure_has_no_defects():
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3), layout="constrained")
    a.plot([1, 2, 3], [1, 4, 9], label="speculative")
    a.plot([1, 2, 3], [2, 3, 4], label="ar")
    a.legend(loc="upper left")
    a.set_xlabel("rows")
    b.bar(["x", "y"], [1, 2])
    b.annotate("tall", (1, 2), xytext=(0, 4), textcoords="offset points", ha="center")
    assert figure_defects(fig) == []


def test_colliding_tick_labels_are_found():
    fig, ax = plt.subplots()
    ax.plot([0.2, 0.5], [1, 2])
    ax.set_xscale("log")
    ax.set_xticks([0.2, 0.205, 0.5], ["0.2x", "3x10^-1", "0.5x"])
    found = figure_defects(fig)
    assert any("tick labels '0.2x' and '3x10^-1' overlap" in d for d in found), found
    ax.set_xticks([0.2, 0.5], ["0.2x", "0.5x"])
    assert figure_defects(fig) == []


def test_overlapping_annotations_are_found_and_separated_ones_are_not():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    ax.annotate("gguf@int8", (0.5, 0.5))
    other = ax.annotate("gguf@bf16", (0.5, 0.5))
    assert any("'gguf@int8' and 'gguf@bf16' overlap" in d for d in figure_defects(fig))
    other.set_position((0.05, 0.9))
    assert figure_defects(fig) == []


def test_look_alike_legend_entries_are_found():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], color="C1", label="quest 16")
    ax.plot([0, 1], [1, 0], color="C1", label="quest 64")
    ax.legend()
    assert any("'quest 16' and 'quest 64' look the same" in d for d in figure_defects(fig))
    ax.lines[1].set_linestyle("--")  # a dashed line is told apart from a solid one
    ax.legend()
    assert figure_defects(fig) == []


def test_bars_of_one_colour_in_a_legend_are_found():
    import pandas as pd

    fig, ax = plt.subplots()
    df = pd.DataFrame({"x": ["a", "b", "a", "b"], "y": [1, 2, 3, 4], "s": ["p", "p", "q", "q"]})
    sns.barplot(df, x="x", y="y", hue="s", palette=["#1f77b4", "#1f77b4"], ax=ax)
    assert any("look the same" in d for d in figure_defects(fig))


def test_a_legend_on_another_panel_or_over_a_label_is_found():
    fig, (a, b) = plt.subplots(1, 2, figsize=(6, 3))
    a.plot([0, 1], [0, 1], label="a long legend entry that reaches across")
    a.legend(loc="upper left", bbox_to_anchor=(0.9, 1.0))
    found = figure_defects(fig)
    assert any("sits on another panel" in d for d in found), found

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="entry")
    ax.set_title("a title under the legend")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 0.99))
    assert any("covers 'a title under the legend'" in d for d in figure_defects(fig))


def test_the_setup_hook_logs_every_drawn_figure(tmp_path, monkeypatch):
    from studylib import plots

    log = tmp_path / "ch09.figures.json"
    monkeypatch.setenv(LOG_ENV, str(log))
    plots.setup()
    assert json.loads(log.read_text()) == {"figures": 0, "defects": []}
    fig, ax = plt.subplots()
    ax.annotate("one", (0.5, 0.5))
    ax.annotate("one too", (0.5, 0.5))
    fig.savefig(tmp_path / "f.png")
    got = json.loads(log.read_text())
    assert got["figures"] == 1 and len(got["defects"]) == 1 and "overlap" in got["defects"][0]
    fig2, ax2 = plt.subplots()
    ax2.plot([0, 1], [0, 1])
    fig2.savefig(tmp_path / "g.png")
    assert json.loads(log.read_text())["figures"] == 2


def _committed_chapters() -> list[Path]:
    return sorted(REPORTS.glob("ch[0-9][0-9].json"))


@pytest.mark.parametrize("path", _committed_chapters(), ids=lambda p: p.stem)
def test_committed_chapter_figures_were_checked_and_are_clean(path):
    log = path.with_name(f"{path.stem}.figures.json")
    assert log.exists(), f"{log.name} is missing: rerun the chapter (studylib reproduce) so its figures are checked"
    got = json.loads(log.read_text())
    assert got["figures"] >= 1, f"{path.stem}: no figure was drawn"
    assert got["defects"] == [], f"{path.stem}: " + "; ".join(got["defects"])


def test_scatter_markers_of_one_colour_are_told_apart():
    fig, ax = plt.subplots()
    for marker, label in (("o", "chat"), ("s", "xsum"), ("D", "humaneval")):
        ax.scatter([1], [1], marker=marker, facecolor="none", edgecolor="black", label=label)
    ax.legend(loc="upper left")
    assert figure_defects(fig) == []


def test_titles_set_edge_to_edge_collide_and_tidy_wraps_them():
    from studylib import plots

    with matplotlib.rc_context({"figure.hooks": []}):  # without the chapters' draw hook, which would wrap them too
        fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    a.set_title("LRU (solid) vs Belady (dashed), hits per pool size", loc="right")
    b.set_title("LRU's share of the clairvoyant reference, per workload", loc="left")
    assert any("overlap" in d for d in figure_defects(fig))
    plots.tidy(fig)
    assert figure_defects(fig) == []


def test_hidden_axes_and_steep_labels_are_not_read():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    ax.twinx().plot([0, 1], [1, 0])  # the twin's hidden x axis repeats the main one's ticks
    off = fig.add_axes([0.6, 0.6, 0.2, 0.2])
    off.set_axis_off()
    off.set_xticks([0.5, 0.51])  # would collide, but an axis switched off draws nothing
    assert figure_defects(fig) == []
    fig2, ax2 = plt.subplots()
    ax2.bar(["a rather long category name", "another long category name", "a third long one"], [1, 2, 3])
    plt.setp(ax2.get_xticklabels(), rotation=60, ha="right")
    assert figure_defects(fig2) == []


def test_a_freed_figures_result_is_kept_under_its_own_key(tmp_path, monkeypatch):
    import gc

    from studylib import plots

    log = tmp_path / "log.json"
    monkeypatch.setenv(LOG_ENV, str(log))
    plots.setup()
    for k in range(3):  # each figure drawn, closed and freed, as the inline backend does after a cell
        fig, ax = plt.subplots()
        ax.annotate("same place", (0.5, 0.5))
        ax.annotate(f"same place {k}", (0.5, 0.5))
        fig.savefig(tmp_path / f"{k}.png")
        plt.close(fig)
        del fig, ax
        gc.collect()
    got = json.loads(log.read_text())
    assert got["figures"] == 3 and len(got["defects"]) == 3


def test_a_title_wider_than_its_panel_hits_the_top_tick_label_unless_the_draw_hook_wraps_it():
    """The CI failure of 169eeb5: a long title reaches left over the y axis, and collides only when the data put
    a tick at the very top. The figure hook every chapter installs wraps such a title before each draw."""
    import io

    def draw() -> tuple[list[str], Any]:
        fig, ax = plt.subplots(figsize=(7.0, 3.6))
        ax.plot([1, 2, 3, 4], [1.0, 1.05, 1.1, 1.15])
        ax.set_ylim(0.9, 1.15)
        ax.set_title("Speedup vs gamma: theory and measurement (illustration, n = 1 prompt)", fontsize=14)
        fig.savefig(io.BytesIO(), format="png")
        return figure_defects(fig), ax

    with matplotlib.rc_context({"figure.hooks": []}):
        defects, _ = draw()
    assert any("'1.15'" in d and "overlap" in d for d in defects)
    with matplotlib.rc_context({"figure.hooks": ["studylib.plots:fit_titles_on_draw"]}):
        defects, ax = draw()
    assert defects == []
    assert "\n" in ax.get_title() and " ".join(ax.get_title().split()).startswith("Speedup vs gamma")
