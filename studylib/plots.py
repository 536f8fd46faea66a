"""One figure style for the whole workbook: seaborn theme, PNG output, a fixed colour per method."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import seaborn as sns
from matplotlib.artist import Artist
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

# A method keeps its colour in every chapter, so a reader can follow "speculative" across figures.
PALETTE: dict[str, str] = {
    "ar": "#4d4d4d",
    "speculative": "#1f77b4",
    "prompt-lookup": "#17becf",
    "jacobi": "#9467bd",
    "lookahead": "#e377c2",
    "static": "#ff7f0e",
    "continuous": "#2ca02c",
    "sequential": "#7f7f7f",
    "dense": "#4d4d4d",
    "window": "#bcbd22",
    "sinks": "#8c564b",
    "blocksparse": "#d62728",
    "studylib": "#1f77b4",
    "hf": "#ff7f0e",
    "roofline": "#2ca02c",
    # The workloads, in tab20's light shades (the methods hold the dark ones), so a workload keeps its
    # colour from chapter 4's sharing figures to chapter 7's stack, whatever else a figure holds.
    "chat": "#aec7e8",
    "system_prompt": "#ffbb78",
    "few_shot": "#98df8a",
    "multi_turn": "#ff9896",
    "tree_of_thought": "#c5b0d5",
    "no_sharing": "#c49c94",
    "xsum": "#f7b6d2",
    "narrativeqa": "#dbdb8d",
    "humaneval": "#9edae5",
}
FIGSIZE = (7.0, 3.6)
DPI = 110


def setup(context: str = "notebook") -> None:
    """Apply the workbook style; inside Jupyter also switch inline figures to PNG so reports stay light."""
    sns.set_theme(context=context, style="whitegrid", palette="colorblind")
    mpl.rcParams.update({
        "figure.figsize": FIGSIZE, "figure.dpi": DPI, "savefig.dpi": DPI, "savefig.bbox": "tight",
        "axes.titlesize": "medium", "axes.titleweight": "bold", "legend.frameon": False,
        "legend.fontsize": "small",
    })
    from studylib.workbook import figure_check
    from studylib.workbook.tables import install

    install()  # every DataFrame a chapter displays goes through one formatting layer
    # Every figure made from here on is checked after each draw (overlapping labels, look-alike legend
    # entries); the chapter runner publishes the log beside the chapter's JSON.
    hooks = [f"{__name__}:fit_titles_on_draw", f"{figure_check.__name__}:watch"]
    mpl.rcParams["figure.hooks"] = [*(h for h in mpl.rcParams["figure.hooks"] if h not in hooks), *hooks]
    figure_check.start_log()
    try:
        from IPython import get_ipython

        if get_ipython() is not None:
            from matplotlib_inline.backend_inline import set_matplotlib_formats

            set_matplotlib_formats("png")
            # The inline backend resets figure.dpi when it activates; pin it again for this kernel.
            mpl.rcParams["figure.dpi"] = DPI
    except ImportError:
        pass


def color(method: str) -> str:
    """The method's colour; unknown names get a stable colour from the extended palette."""
    if method in PALETTE:
        return PALETTE[method]
    extra = sns.color_palette("tab20", 20).as_hex()
    return extra[sum(map(ord, method)) % len(extra)]


def palette(methods: Iterable[str]) -> dict[str, str]:
    """A ``hue`` palette for seaborn covering exactly ``methods``, every one in its own colour: a name
    without a fixed colour whose stable colour is taken already in this palette moves to the next free one
    (two workloads in one red could not be told apart)."""
    out: dict[str, str] = {}
    extra = sns.color_palette("tab20", 20).as_hex()
    names = list(dict.fromkeys(methods))
    for m in names:  # the fixed colours first, so a hashed one never takes a method's own
        if m in PALETTE:
            out[m] = PALETTE[m]
    for m in names:
        if m in out:
            continue
        c = color(m)
        i = extra.index(c)
        for k in range(len(extra)):
            if extra[(i + k) % len(extra)] not in out.values():
                c = extra[(i + k) % len(extra)]
                break
        out[m] = c
    return {m: out[m] for m in names}


def family_palette(series: Iterable[str], family) -> dict[str, str]:
    """A ``hue`` palette where each series takes its family's colour (``family(series)``, e.g. an attention
    pattern's kind), in distinct shades when a family has several members: two Quest budgets never share
    one colour, and a reader still sees they are both Quest."""
    groups: dict[str, list[str]] = {}
    for s in dict.fromkeys(series):
        groups.setdefault(family(s), []).append(s)
    out = {}
    for fam, members in groups.items():
        base = color(fam)
        if len(members) == 1:
            out[members[0]] = base
            continue
        shades = sns.dark_palette(base, n_colors=len(members) + 2, reverse=False).as_hex()[2:]
        out.update(dict(zip(members, shades, strict=True)))
    return out


def _overlap_area(a, b) -> float:
    """Pixels two boxes share (0 when they only touch or lie apart)."""
    return max(min(a.x1, b.x1) - max(a.x0, b.x0), 0.0) * max(min(a.y1, b.y1) - max(a.y0, b.y0), 0.0)


def label_points(ax, points, fontsize: int = 9) -> None:
    """Name each point (label, x, y) beside it, inside the axes and 3 px clear of every text already there:
    the titles, the axis and tick labels, texts put on the axes before, and the labels placed before it. Each
    tries a ring of offsets around its point, nearest first, and keeps the first free one (if none is, the one
    that overlaps least)."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    offsets = [(6, 4, "left"), (6, -12, "left"), (-6, 4, "right"), (-6, -12, "right"), (6, 16, "left"),
               (6, -24, "left"), (-6, 16, "right"), (-6, -24, "right"), (0, 28, "center"), (0, -36, "center")]
    # Everything the figure check compares a label with: a point right under the title once got its name
    # drawn over the title, since only the other names were kept clear of.
    texts = [ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None), *ax.texts]
    for axis in (ax.xaxis, ax.yaxis) if ax.axison else ():
        if axis.get_visible():
            # the tick labels the last draw placed, as the check reads them (get_ticklabels also lists
            # stale ones outside the view)
            texts += [axis.label, *(t for tick in axis._update_ticks() for t in (tick.label1, tick.label2))]
    # Padded past the figure check's own margin (it calls boxes within 2 px a collision): two padded boxes
    # that share no pixel are 3 px apart.
    taken = [t.get_window_extent(renderer).padded(1.5) for t in texts
             if t is not None and t.get_visible() and str(t.get_text()).strip()]
    frame = ax.get_window_extent(renderer)
    for label, x, y in sorted(points, key=lambda p: (p[2], p[1])):
        best = None  # (overlap, annotation, box) of the least bad offset so far
        for dx, dy, ha in offsets:
            ann = ax.annotate(label, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize, ha=ha)
            box = ann.get_window_extent(renderer).padded(1.5)
            # a name hanging out of the axes runs into the tick labels or the neighbouring panel: the part
            # outside counts as overlap too
            overlap = (sum(_overlap_area(box, b) for b in taken)
                       + box.width * box.height - _overlap_area(box, frame))
            if best is None or overlap < best[0]:
                if best is not None:
                    best[1].remove()
                best = (overlap, ann, box)
            else:
                ann.remove()
            if overlap == 0:
                break
        if best is not None:
            taken.append(best[2])


def legend_below(fig, ax, ncol: int = 4) -> None:
    """Move ``ax``'s legend under the whole figure, in columns, so no entry is cut by a neighbouring panel
    and nothing covers data: its top sits under the lowest thing any panel draws (tick labels and axis
    labels included), and the saved figure's tight box grows to hold it."""
    legend = ax.get_legend()
    if legend is None:
        return
    # the legend's own entries: a legend built from stand-in handles (a key of colours) has no labelled
    # artists for get_legend_handles_labels to find
    handles, labels = list(legend.legend_handles), [t.get_text() for t in legend.get_texts()]
    legend.remove()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    lowest = min(a.get_tightbbox(renderer).y0 for a in fig.axes if a.get_visible())
    y = fig.transFigure.inverted().transform((0, lowest))[1]
    fig.legend(handles, labels, loc="upper center", ncol=min(ncol, max(len(labels), 1)), fontsize="small",
               frameon=False, bbox_to_anchor=(0.5, y - 0.01))


def lineplot_ci(df: Any, x: str, y: str, hue: str | None = None, low: str | None = None, high: str | None = None,
                ax: plt.Axes | None = None, logx: bool = False, logy: bool = False, title: str | None = None,
                **kw: Any) -> plt.Axes:
    """Lines with a shaded 95% band: from ``low``/``high`` columns if given (precomputed bootstrap CIs),
    otherwise seaborn's bootstrap over the repeated rows of each ``x``."""
    ax = ax if ax is not None else plt.subplots(figsize=FIGSIZE)[1]
    pal = palette(df[hue].astype(str)) if hue else None
    if low and high:
        groups = df.groupby(hue, sort=False) if hue else [(None, df)]
        for name, g in groups:
            g = g.sort_values(x)
            c = pal[str(name)] if pal else None
            ax.plot(g[x], g[y], marker="o", ms=4, label=name, color=c, **kw)
            ax.fill_between(g[x], g[low], g[high], alpha=0.2, color=c, linewidth=0)
        if hue:
            ax.legend(title=hue)
    else:
        sns.lineplot(data=df, x=x, y=y, hue=hue, palette=pal, marker="o", errorbar=("ci", 95), ax=ax, **kw)
    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    return ax


def plain_log_axis(axis: Any) -> None:
    """Ticks at 1-2-5 steps labelled 0.5, 1, 2 ... instead of 10^0 and 2x10^-1."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def roofline(ax: plt.Axes, bandwidth_gbs: float, peak_gflops: float, points: Sequence[Mapping[str, Any]] | Any,
             label_col: str = "label") -> plt.Axes:
    """Draw the roofline min(peak, bandwidth x intensity) on log axes and place measured points.

    points: rows with ``intensity`` (FLOP/byte), ``gflops`` (achieved) and a label; a DataFrame works.
    """
    import numpy as np

    rows = points.to_dict("records") if hasattr(points, "to_dict") else list(points)
    ridge = peak_gflops / bandwidth_gbs  # FLOP/byte where the two roofs meet
    xs = [r["intensity"] for r in rows] + [ridge]
    grid = np.logspace(np.log10(min(xs) / 4), np.log10(max(xs) * 4), 200)
    ax.plot(grid, np.minimum(peak_gflops, bandwidth_gbs * grid), color="black", lw=1.5)
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, peak_gflops), textcoords="offset points", xytext=(4, -12),
                fontsize="small", color="grey")
    for r in rows:
        name = str(r.get(label_col, ""))
        ax.scatter(r["intensity"], r["gflops"], s=36, color=color(name.split()[0]) if name else None, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        plain_log_axis(axis)
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"Roofline: {bandwidth_gbs:.3g} GB/s, {peak_gflops:.3g} GFLOP/s peak")
    # Points at large batch sit close together under the compute roof: their names are placed where they
    # overlap no other (after the axes are final, so the placement measures the drawn positions).
    label_points(ax, [(str(r[label_col]), r["intensity"], r["gflops"]) for r in rows if str(r.get(label_col, ""))],
                 fontsize=8)
    return ax


def fmt_number(v: Any, digits: int = 3) -> str:
    """``digits`` significant digits without scientific notation for large values (1397, 52.9, 0.00298)."""
    if not isinstance(v, int | float) or isinstance(v, bool) or v != v:
        return str(v)
    if isinstance(v, int) or float(v).is_integer() and abs(v) >= 1:
        return f"{int(v):d}"
    return f"{v:.0f}" if abs(v) >= 10**digits else f"{v:.{digits}g}"


def table(df: Any, digits: int = 3, index: bool = False) -> Any:
    """A DataFrame for reading, through the one formatting layer (``workbook.tables``): readable headers
    with units, significant figures, CIs in the cell, yes/no, "not measured" with its reason. ``index``:
    keep a labelled index as the first column. (``digits`` is kept for callers; the layer uses three.)"""
    from studylib.workbook.tables import ReadableTable

    return ReadableTable(df if index or df.index.name is None else df.reset_index(drop=False))


def _visible(locs: Any, lo: float, hi: float) -> list[float]:
    return [v for v in locs if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)]


def _spaced(ticks, lo: float, hi: float, parts: int = 8) -> list:
    """``ticks`` thinned so that neighbours on a log axis from ``lo`` to ``hi`` are at least 1/``parts`` of
    its length apart (their labels cannot overlap), keeping the first."""
    import math

    gap = (math.log10(hi) - math.log10(lo)) / parts
    kept: list = []
    for t in ticks:
        if not kept or math.log10(t) - math.log10(kept[-1]) >= gap:
            kept.append(t)
    return kept


def readable_log_axis(axis: Any, min_ticks: int = 3) -> None:
    """Give a log axis at least ``min_ticks`` labelled ticks (when its range allows): a range under a decade
    otherwise shows one label, or none, and the reader cannot read a value off it. Tries 1-2-5 steps, then every
    integer step of the decade, then plain evenly spaced values; labels are plain numbers. Ticks a figure set on
    purpose (a ``FixedLocator``, e.g. ``set_xticks``) are left alone."""
    import numpy as np
    from matplotlib.ticker import FixedLocator, MaxNLocator

    if axis.get_scale() != "log" or isinstance(axis.get_major_locator(), FixedLocator):
        return
    lo, hi = sorted(axis.get_view_interval())
    if not (lo > 0 and np.isfinite(lo) and np.isfinite(hi)) or hi <= lo:
        return
    if len(_visible(axis.get_majorticklocs(), lo, hi)) >= min_ticks:
        return
    for subs in ((1.0, 2.0, 5.0), tuple(float(s) for s in range(1, 10))):
        locator = LogLocator(base=10, subs=subs, numticks=40)
        # every integer step crowds the top of a decade (90 beside 100): keep ticks an eighth of the axis apart
        ticks = _spaced(_visible(locator.tick_values(lo, hi), lo, hi), lo, hi)
        if len(ticks) >= min_ticks:
            axis.set_major_locator(FixedLocator(ticks))
            break
    else:
        ticks = [v for v in MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if lo <= v <= hi]
        if len(ticks) < 2:
            ticks = [lo, hi]
        axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    axis.set_minor_formatter(NullFormatter())


def _data_points(ax: plt.Axes, per_segment: int = 24) -> Any:
    """Display coordinates of what ``ax`` plots: points along every data line (reference lines drawn with
    ``axhline``/``axvline`` excluded; no segment across a gap), scatter offsets, and a grid over every bar."""
    import numpy as np

    pts = [np.empty((0, 2))]
    t = np.linspace(0.0, 1.0, per_segment)[:, None, None]
    for line in ax.get_lines():
        if not line.get_visible() or line.get_transform() != ax.transData:
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
        ok = np.isfinite(xy).all(axis=1)
        pts.append(xy[ok])
        seg = ok[:-1] & ok[1:]  # a segment only between two drawn points, so a NaN gap stays a gap
        if seg.any():  # sample each segment, so a legend over the middle of a long segment counts
            a, b = xy[:-1][seg], xy[1:][seg]
            pts.append((a[None] * (1 - t) + b[None] * t).reshape(-1, 2))
    for coll in ax.collections:
        offs = np.asarray(coll.get_offsets(), float)
        if offs.ndim == 2 and len(offs):
            pts.append(coll.get_offset_transform().transform(offs))
    for patch in ax.patches:
        bbox = patch.get_window_extent()
        gx, gy = np.meshgrid(np.linspace(bbox.x0, bbox.x1, 5), np.linspace(bbox.y0, bbox.y1, 9))
        pts.append(np.column_stack([gx.ravel(), gy.ravel()]))
    out = np.concatenate(pts)
    return out[np.isfinite(out).all(axis=1)]


def legend_covers_data(ax: plt.Axes) -> bool:
    """True when ``ax``'s legend box covers any plotted point of ``ax`` or of another axes of its figure."""
    legend = ax.get_legend()
    if legend is None or not legend.get_visible():
        return False
    fig = ax.figure
    fig.canvas.draw()
    box = legend.get_window_extent()
    for other in fig.axes:
        if not other.bbox.overlaps(box):
            continue
        pts = _data_points(other)
        if ((pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1) & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1)).any():
            return True
    return False


def _overlaps_other_axes(ax: plt.Axes) -> bool:
    """Whether ``ax``'s legend overlaps another panel (a twin axes on the same panel does not count)."""
    box = ax.get_legend().get_window_extent()
    return any(other is not ax and other.get_visible() and other.bbox.bounds != ax.bbox.bounds
               and other.bbox.overlaps(box) for other in ax.figure.axes)


# Where a legend may go, in order: the four inside corners, then beside the axes, then under it.
_PLACES = ([{"loc": loc} for loc in ("upper left", "upper right", "lower right", "lower left", "center right",
                                     "center left", "upper center", "lower center")]
           + [{"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0},
              {"loc": "upper center", "bbox_to_anchor": (0.5, -0.22), "borderaxespad": 0.0}])


def _axes_of(obj: Any) -> list[plt.Axes]:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    if isinstance(obj, Axes):
        return [obj]
    if isinstance(obj, Figure):
        return list(obj.axes)
    if isinstance(obj, np.ndarray | list | tuple):
        return [a for a in np.ravel(np.asarray(obj, dtype=object)) if isinstance(a, Axes)]
    fig = getattr(obj, "figure", None)  # a seaborn FacetGrid / JointGrid
    return list(fig.axes) if isinstance(fig, Figure) else []


def _wrap_titles(axes: Iterable[plt.Axes], renderer: Any) -> None:
    import textwrap

    for ax in axes:
        room = ax.get_window_extent(renderer).width
        for title in (ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None)):
            text = " ".join(title.get_text().split()) if title is not None else ""
            if not text or room <= 0:
                continue
            chars, width = len(text), title.get_window_extent(renderer).width
            # A title wider than its panel reaches over the panel's top tick label (or a neighbour's title):
            # narrow it line by line until it fits. Word wrapping is the only change; the words stay.
            while width > room and chars > 12:
                chars = max(12, min(chars - 2, int(chars * room / width) - 1))
                title.set_text("\n".join(textwrap.wrap(text, chars)))
                width = title.get_window_extent(renderer).width


def fit_titles(axes: Sequence[plt.Axes]) -> None:
    """Wrap a panel title wider than its panel onto more lines, so it runs into no neighbour's title, colour
    bar or the panel's own top tick label."""
    if not axes:
        return
    fig = axes[0].figure
    fig.canvas.draw()
    _wrap_titles(axes, fig.canvas.get_renderer())


class _TitleFitter(Artist):
    """Drawn first on every figure (lowest zorder, left out of the layout): wraps each panel title that the
    panel's final size cannot hold, so a chapter's figure never depends on which tick happens to sit at the
    top of its y axis (a title wider than its panel collides with it only when one does)."""

    zorder = -1e9

    def draw(self, renderer: Any) -> None:
        if self.figure is not None:  # the figure fit_titles_on_draw added it to
            _wrap_titles([a for a in self.figure.axes if a.get_visible()], renderer)


def fit_titles_on_draw(fig: Any) -> None:
    """matplotlib ``figure.hooks`` entry: every draw of ``fig`` first wraps the titles its panels cannot hold."""
    fitter = _TitleFitter()
    fitter.set_in_layout(False)
    fig.add_artist(fitter)


def tidy(obj: Any) -> Any:
    """Last step of every workbook figure, on the axes it is given (a Figure: all of them; an Axes or an array
    of Axes: those; a seaborn grid: its figure's): each log axis gets readable ticks, a title wider than its
    panel wraps, and a legend that covers data moves to the first place that covers none (an inside corner,
    beside the axes, under it) without landing on another panel. Returns its argument."""
    axes = _axes_of(obj)
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            readable_log_axis(axis)
    fit_titles(axes)
    for ax in axes:
        legend = ax.get_legend()
        if legend is None or not legend_covers_data(ax):
            continue
        title = legend.get_title().get_text() or None
        handles = legend.legend_handles
        labels = [t.get_text() for t in legend.get_texts()]
        size = legend.get_texts()[0].get_fontsize() if labels else None
        for place in _PLACES:
            ax.legend(handles, labels, title=title, fontsize=size, **place)
            if not legend_covers_data(ax) and not _overlaps_other_axes(ax):
                break
    return obj
