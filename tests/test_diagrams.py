"""The mechanism pictures: the batching simulation behind the timelines obeys each policy's rules, and
every chapter's picture draws (the masks from the attention patterns themselves)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from studylib import diagrams  # noqa: E402

REQS = [(0, 6), (0, 2), (0, 4), (1, 3), (2, 5), (3, 2)]


def _end(rows):
    return max(e for _, _, e, _ in rows)


def test_batching_policies_follow_their_rules():
    s = diagrams.simulate_batching(REQS, slots=3)
    assert _end(s["sequential"]) == sum(n for _, n in REQS)  # one at a time, back to back
    # each request does exactly its own work under every policy
    for rows in s.values():
        work = {}
        for i, a, b, kind in rows:
            if kind == "work":
                work[i] = work.get(i, 0) + b - a
                assert a >= REQS[i][0]  # never before it arrives
        assert work == {i: n for i, (_, n) in enumerate(REQS)}
    assert any(kind == "idle" for *_, kind in s["static"])  # finished rows wait for the longest
    assert _end(s["continuous"]) <= _end(s["static"]) <= _end(s["sequential"])
    # continuous never runs more than `slots` requests in one step
    for t in range(_end(s["continuous"])):
        assert sum(1 for _, a, b, _ in s["continuous"] if a <= t < b) <= 3


def test_draft_verify_checks_its_arguments():
    with pytest.raises(ValueError):
        diagrams.draft_verify(gamma=4, accepted=5)


@pytest.mark.parametrize("chapter", sorted(diagrams.MECHANISMS))
def test_every_mechanism_draws(chapter):
    caption, figs = diagrams.mechanism_figures(chapter, {"gamma": 3, "system_tokens": 64, "block_size": 8})
    assert caption and figs
    for f in figs:
        assert f.axes
        matplotlib.pyplot.close(f)


def test_masks_come_from_the_patterns():
    fig = diagrams.attention_masks(("dense", "window:16"), seq_len=64)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].endswith("100% of causal pairs") and "window:16" in titles[1]
    assert not titles[1].endswith("100% of causal pairs")
    matplotlib.pyplot.close(fig)


def test_the_new_mechanisms_use_the_librarys_own_rules():
    """EAGLE's tree keeps the nodes eagle.select_nodes keeps; the Q4_1/int8 picture rounds x as the kernel
    does; every chapter with a technique has its picture."""
    for n in (2, 3, 7, 8):
        caption, figs = diagrams.mechanism_figures(n, {"eagle_tree": "3,2,6"})
        assert caption and figs
        for f in figs:
            diagrams._plt().close(f)
    assert len(diagrams.mechanism_figures(2, {"eagle_tree": "5,4,16"})[1]) == 2


@pytest.mark.parametrize("params", [{}, {"gamma": 3, "system_tokens": 64, "block_size": 8}], ids=["defaults", "small"])
@pytest.mark.parametrize("chapter", sorted(diagrams.MECHANISMS))
def test_every_mechanism_reads_at_the_page_size(chapter, params):
    """Text of at least diagrams.FONT points, no box's label spilling out of its box, and the book's figure
    check (overlapping texts, titles and labels) clean."""
    from matplotlib.patches import Rectangle
    from matplotlib.text import Text

    from studylib.workbook.figure_check import figure_defects

    _, figs = diagrams.mechanism_figures(chapter, params)
    for fig in figs:
        assert figure_defects(fig) == []
        r = fig.canvas.get_renderer()
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
        assert min(t.get_fontsize() for t in texts) >= diagrams.FONT
        for ax in fig.axes:
            boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
            for t in ax.texts:
                x, y = t.get_position()
                home = [p for p in boxes if p.get_x() <= x <= p.get_x() + p.get_width()
                        and p.get_y() <= y <= p.get_y() + p.get_height()]
                if home and t.get_text().strip():
                    inner = t.get_window_extent(r)
                    outer = home[-1].get_window_extent(r)
                    assert (inner.x0 >= outer.x0 - 1 and inner.x1 <= outer.x1 + 1
                            and inner.y0 >= outer.y0 - 1 and inner.y1 <= outer.y1 + 1), t.get_text()
        matplotlib.pyplot.close(fig)
