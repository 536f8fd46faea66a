"""Figure defects a reader would see, found from matplotlib's own bounding boxes after a draw.

A figure is checked each time it is drawn (shown inline, or saved): ``plots.setup`` registers
:func:`watch` as a figure hook, so every figure a chapter makes is checked, whatever made it (seaborn,
pandas or plain matplotlib). The classes of defect:

- two tick labels of one axis overlap (the "0.2x 3x10^-1" collision);
- two texts overlap: annotations, axis labels, titles and tick labels of different axes;
- a legend overlaps a text, or a panel it does not belong to;
- two entries of one legend look the same (colour, line style, marker and hatch), so a reader cannot
  tell them apart.

When ``STUDYLIB_FIGURE_LOG`` names a file (the chapter runner sets it per chapter), every check is written
there as JSON (``{"figures": n, "defects": [...]}``); the runner publishes it beside the chapter's JSON
as ``chNN.figures.json`` and the tests read the committed ones.
"""

from __future__ import annotations

import json
import os
from itertools import combinations
from pathlib import Path
from typing import Any

LOG_ENV = "STUDYLIB_FIGURE_LOG"
# Two texts collide when their boxes come closer than this many pixels: text set edge to edge reads as one
# run ("(dashed)LRU's share"), while font hinting moves an extent by a pixel either way.
SLACK_PX = -2.0


def _overlap(a: Any, b: Any, slack: float = SLACK_PX) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > slack) and (min(a.y1, b.y1) - max(a.y0, b.y0) > slack)


def _shown(text: Any) -> bool:
    return bool(text is not None and text.get_visible() and str(text.get_text()).strip())


def _steep(text: Any) -> bool:
    """Rotated by more than 30 degrees from the horizontal (either way)."""
    return 30 < abs(float(text.get_rotation())) % 180 < 150


def _name(fig: Any) -> str:
    titles = [t for t in (getattr(fig, "_suptitle", None), *(ax.title for ax in fig.axes)) if _shown(t)]
    return repr(titles[0].get_text()) if titles else f"figure {getattr(fig, 'number', '') or id(fig)}"


def _tick_labels(axis: Any) -> list[Any]:
    """The tick labels matplotlib draws for ``axis`` (within the view, major and minor, both sides)."""
    out = []
    for tick in axis._update_ticks():  # exactly the ticks the last draw placed
        out += [t for t in (tick.label1, tick.label2) if _shown(t)]
    return out


def _legends(fig: Any) -> list[tuple[Any, Any]]:
    """(legend, the axes it belongs to or None for a figure legend)."""
    out = [(ax.get_legend(), ax) for ax in fig.axes if ax.get_legend() is not None]
    out += [(leg, None) for leg in getattr(fig, "legends", [])]
    return [(leg, ax) for leg, ax in out if leg.get_visible()]


def _look(handle: Any) -> tuple | None:
    """What tells a legend entry apart: colour, line style, marker, hatch. None for an invisible handle
    (seaborn draws section titles as blank entries)."""
    from matplotlib.colors import to_rgba

    if handle is None or not handle.get_visible():
        return None

    def rgba(c: Any) -> tuple | None:
        try:
            import numpy as np

            arr = np.asarray(c, dtype=float)
            if arr.ndim == 2:
                if not len(arr):
                    return None
                arr = arr[0]
            r = tuple(round(float(v), 3) for v in to_rgba(arr))
        except (TypeError, ValueError):
            try:
                r = tuple(round(float(v), 3) for v in to_rgba(c))
            except (TypeError, ValueError):
                return None
        return None if r[3] == 0 else r

    if hasattr(handle, "get_linestyle") and hasattr(handle, "get_marker"):  # Line2D
        colour = rgba(handle.get_color())
        marker = str(handle.get_marker())
        face = rgba(handle.get_markerfacecolor()) if marker not in ("None", "", " ") else None
        style = handle.get_linestyle() if handle.get_linewidth() > 0 else "None"
        if colour is None and face is None:
            return None
        return ("line", colour, style, marker, face)
    face = rgba(handle.get_facecolor()) if hasattr(handle, "get_facecolor") else None
    edge = rgba(handle.get_edgecolor()) if hasattr(handle, "get_edgecolor") else None
    hatch = handle.get_hatch() if hasattr(handle, "get_hatch") else None
    if face is None and edge is None:
        return None
    shape = None  # a scatter's marker: its path, which tells a square from a circle of the same colour
    if hasattr(handle, "get_paths") and handle.get_paths():
        shape = tuple(map(tuple, handle.get_paths()[0].vertices.round(2).tolist()))
    return ("patch", face, edge, hatch, shape)


def figure_defects(fig: Any, renderer: Any = None) -> list[str]:
    """Every defect of ``fig`` as one line each (empty: none). Without a ``renderer`` (the one a draw
    event carries), the figure is drawn first."""
    if renderer is None:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
    name = _name(fig)
    defects: list[str] = []
    texts: list[tuple[str, Any, Any]] = []  # (group, artist, box); one group's members are compared elsewhere
    for i, ax in enumerate(a for a in fig.axes if a.get_visible()):
        # A panel switched off (set_axis_off) or an axis hidden (a twin's) draws no ticks or axis label.
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)) if ax.axison else ():
            if not axis.get_visible():
                continue
            labels = _tick_labels(axis)
            boxes = [t.get_window_extent(renderer) for t in labels]
            for (ta, ba), (tb, bb) in combinations(zip(labels, boxes, strict=True), 2):
                if _steep(ta) and _steep(tb):
                    continue  # steeply rotated labels: their upright boxes overlap where the text does not
                if _overlap(ba, bb):
                    defects.append(f"{name}, panel {i + 1}: {which} tick labels {ta.get_text()!r} and "
                                   f"{tb.get_text()!r} overlap")
            texts += [(f"ticks {i} {which}", t, b) for t, b in zip(labels, boxes, strict=True)]
            label = axis.label
            if _shown(label):
                texts.append((f"label {i} {which}", label, label.get_window_extent(renderer)))
        for t in (ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None)):
            if _shown(t):
                texts.append((f"title {i}", t, t.get_window_extent(renderer)))
        for t in ax.texts:
            if _shown(t):
                texts.append((f"text {id(t)}", t, t.get_window_extent(renderer)))
    for t in (getattr(fig, "_suptitle", None), *fig.texts):
        if _shown(t):
            texts.append((f"text {id(t)}", t, t.get_window_extent(renderer)))
    for (ga, ta, ba), (gb, tb, bb) in combinations(texts, 2):
        if ga != gb and _overlap(ba, bb):
            defects.append(f"{name}: {ta.get_text()!r} and {tb.get_text()!r} overlap")
    for leg, owner in _legends(fig):
        box = leg.get_window_extent(renderer)
        title = leg.get_title().get_text() or "legend"
        for _, t, b in texts:
            if _overlap(box, b):
                defects.append(f"{name}: the legend {title!r} covers {t.get_text()!r}")
        for other in fig.axes:
            if (owner is not None and other is not owner and other.get_visible()
                    and other.bbox.bounds != owner.bbox.bounds and _overlap(box, other.bbox)):
                defects.append(f"{name}: the legend {title!r} sits on another panel")
                break
        seen: dict[tuple, str] = {}
        for handle, text in zip(leg.legend_handles, leg.get_texts(), strict=False):
            look, label = _look(handle), text.get_text()
            if look is None or not label.strip():
                continue
            if look in seen and seen[look] != label:
                defects.append(f"{name}: legend entries {seen[look]!r} and {label!r} look the same")
            seen.setdefault(look, label)
    return list(dict.fromkeys(defects))


# ------------------------------------------------------------------------------------------ the hook

_checked: dict[int, list[str]] = {}
_serial = iter(range(1, 1 << 62))


def _key(fig: Any) -> int:
    """A number of this figure's own: ``id`` is reused once a closed figure is freed, and a new figure
    would then overwrite the old one's result."""
    if "_studylib_check_key" not in fig.__dict__:
        fig.__dict__["_studylib_check_key"] = next(_serial)
    return fig.__dict__["_studylib_check_key"]


def _log() -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    defects = [d for ds in _checked.values() for d in ds]
    Path(path).write_text(json.dumps({"figures": len(_checked), "defects": list(dict.fromkeys(defects))},
                                     indent=1, ensure_ascii=False), encoding="utf-8")


def _on_draw(event: Any) -> None:
    fig = event.canvas.figure
    try:
        _checked[_key(fig)] = figure_defects(fig, event.renderer)
    except Exception as exc:  # a check that cannot run is itself reported, never hidden
        _checked[_key(fig)] = [f"{_name(fig)}: the figure check failed ({type(exc).__name__}: {exc})"]
    _log()


def watch(fig: Any) -> None:
    """matplotlib ``figure.hooks`` entry: check ``fig`` after each draw (the last draw's result counts)."""
    fig.canvas.mpl_connect("draw_event", _on_draw)


def start_log() -> None:
    """Begin this process's log (an empty one means: figures were watched and none was drawn yet)."""
    _checked.clear()
    _log()
