"""A sweep's page in the book, ``<out>/sweeps/<name>/index.html``: the grid, one row per cell with its
verdicts and deciding numbers (each cell's own pages linked), and one figure per measured quantity
across the grid. Everything on it is read from the cells' saved results."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from studylib.workbook.paths import atomic_write

_CSS = """
table.sweep { border-collapse: collapse; font-size: 0.88em; } .table-wrap { max-width: 100%; overflow-x: auto; }
table.sweep th, table.sweep td { text-align: left; vertical-align: top; padding: 4px 7px; border-top: 1px solid #ddd; }
table.sweep th { background: #f0f0f0; } .failed { color: #a00; }
"""


def sweep_dirs(profile_dir: Path) -> list[Path]:
    """The sweeps under a report folder (each holds a ``sweep.json``), by name."""
    return sorted(p.parent for p in (Path(profile_dir) / "sweeps").glob("*/sweep.json"))


def _label(overrides: dict[str, Any], varying: list[str]) -> str:
    keys = varying or sorted(overrides)
    return ", ".join(f"{k}={overrides.get(k)}" for k in keys) or "defaults"


def _cell_verdicts(cell_dir: Path, chapter: int) -> list:
    from studylib.claims import load_chapter

    path = cell_dir / f"ch{chapter:02d}.json"
    if not path.exists():
        return []
    try:
        return load_chapter(path)["verdicts"]
    except Exception:  # noqa: BLE001 - one unreadable cell must not take the page down
        return []


def _why_exploratory(v) -> str:
    """Why an exploratory cell's verdict is not the one its parts give (a cell measured before the study's
    current declarations shows a positive verdict as inconclusive, and its row would read "3/3 parts hold,
    inconclusive" with no reason): the rules' own note, said once after the number."""
    if not getattr(v, "exploratory", False):
        return ""
    _, marked, note = str(v.conditions or "").rpartition("exploratory: ")
    return f" (exploratory: {note})" if marked and note else " (exploratory)"


def _measure(v) -> str:
    from studylib.workbook.book import verdict_number

    return verdict_number(v)


def quantities(summary: dict[str, Any], sweep_dir: Path) -> dict[str, list[tuple[str, float, float, float, Any]]]:
    """Per measured quantity (a verdict row with a number): [(cell label, value, low, high, bar)]."""
    varying = list(summary.get("grid", {}))
    out: dict[str, list] = {}
    for c in summary["cells"]:
        if c["status"] not in ("ok", "up to date"):
            continue  # a failed rerun keeps the last good files: they are not this sweep's result
        for v in _cell_verdicts(sweep_dir / c["cell"], c["chapter"]):
            if isinstance(v.measured, int | float) and not isinstance(v.measured, bool) and v.ci:
                # the metric's words without what a cell names in parentheses (its engine, say)
                stem = re.sub(r"\s*\([^()]*\)\s*$", "", v.metric)
                out.setdefault(f"C{v.id[1:]} ch{v.chapter:02d}: {stem}", []).append(
                    (_label(c.get("overrides", {}), varying), float(v.measured), float(v.ci[0]), float(v.ci[1]),
                     v.threshold))
    return {k: pts for k, pts in out.items() if len(pts) >= 2}


def _save(fig, path: Path, defects: list[str]) -> Path:
    """Save ``fig`` after the book's figure check (overlapping labels, look-alike legend entries) has read it;
    its findings join ``defects``, which the page writes beside itself as ``figures.json``."""
    import matplotlib.pyplot as plt

    from studylib.workbook.figure_check import figure_defects

    defects += [f"{path.name}: {d}" for d in figure_defects(fig)]
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _figure(name: str, pts: list, path: Path, defects: list[str]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    # A tick per cell, one "parameter=value" per line, the figure as wide as its longest line needs: long
    # model names set side by side at a slant overlapped (the figure check found them).
    ticks = [p[0].replace(", ", "\n") for p in pts]
    widest = max(len(line) for t in ticks for line in t.split("\n"))
    want = len(pts) * (0.075 * widest + 0.3) + 1.5
    # Side by side up to a page's width; a grid too wide for that turns its labels upright instead.
    upright = want > 12
    fig, ax = plt.subplots(figsize=(max(4.5, min(want, 12)), 3.4 + (0.06 * widest if upright else 0)))
    xs = list(range(len(pts)))
    ys = [p[1] for p in pts]
    ax.errorbar(xs, ys, yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]], fmt="o", capsize=4)
    if pts[0][4] is not None:
        ax.axhline(pts[0][4], color="#a00", linestyle="--", linewidth=1, label=f"bar {pts[0][4]:g}")
        ax.legend(loc="best", fontsize=8)
    ax.set_xticks(xs, ticks, fontsize=8, rotation=90 if upright else 0)
    ax.set_title("\n".join(_wrap(name, 70)), fontsize=9)
    fig.tight_layout()
    return _save(fig, path, defects)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [text]


def _chapter1_cells(summary: dict[str, Any], sweep_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """(cell label, chapter 1's measurements) of every chapter-1 cell with results of this sweep, read once."""
    varying = list(summary.get("grid", {}))
    out = []
    for c in summary["cells"]:
        if c["chapter"] != 1 or c["status"] not in ("ok", "up to date"):
            continue
        path = sweep_dir / c["cell"] / "ch01.json"
        if path.exists():
            out.append((_label(c.get("overrides", {}), varying),
                        json.loads(path.read_text(encoding="utf-8")).get("measurements") or {}))
    return out


def step_cost_frame(summary: dict[str, Any], sweep_dir: Path, cells: list | None = None):
    """Chapter 1's step cost against rows (v(k), with its CI, and the roofline model's ridge) from every
    cell that ran it: one frame with the cell's label, for the regime figure. ``cells``: ``_chapter1_cells``
    when the caller has read them already."""
    import pandas as pd

    cells = _chapter1_cells(summary, sweep_dir) if cells is None else cells
    frames = [pd.DataFrame(m["step_vs_rows"]).assign(cell=label) for label, m in cells if m.get("step_vs_rows")]
    return pd.concat(frames, ignore_index=True) if frames else None


def regime_table(summary: dict[str, Any], sweep_dir: Path, at: tuple[int, ...] = (8, 16),
                 cells: list | None = None) -> list[dict[str, Any]]:
    """Per chapter-1 cell and engine: v(k) at the rows in ``at`` with their CIs, the roofline model's ridge
    (rows where a step turns compute-bound), the measured peak of the kernel, and the batch-1 decode's
    fraction of the measured bandwidth. The numbers that say whether the cell's model runs memory-bound."""
    from studylib.workbook.book import format_ci

    out = []
    for label, m in _chapter1_cells(summary, sweep_dir) if cells is None else cells:
        bw = m.get("bandwidth_fraction") or {}
        frac = (format_ci(bw["value"], (bw.get("ci_low"), bw.get("ci_high")), bw.get("n"))
                if isinstance(bw.get("value"), int | float) else "-")
        by_engine: dict[str, list[dict]] = {}
        for r in m.get("step_vs_rows") or []:
            by_engine.setdefault(str(r.get("engine")), []).append(r)
        for eng, rows in by_engine.items():
            row = {"cell": label, "engine": eng}
            for k in at:
                r = next((r for r in rows if r.get("rows") == k), None)
                row[f"v({k})"] = (format_ci(r["v"], (r.get("v_low"), r.get("v_high")), r.get("n"), "repeats in one process")
                                  if r and isinstance(r.get("v"), int | float) else "-")
            ridge = rows[0].get("ridge_rows")
            row["ridge (rows)"] = f"{ridge:.3g}" if isinstance(ridge, int | float) else "-"
            peak = rows[0].get("peak_gmacs")
            row["kernel peak (G multiply-adds/s)"] = f"{peak:.3g}" if isinstance(peak, int | float) else "-"
            row["batch-1 decode, fraction of bandwidth"] = frac
            row["_fraction"] = bw.get("value")
            out.append(row)
    return out


def _rows_every_cell_stepped(g) -> set:
    """The row counts that every cell of one engine's frame stepped."""
    return set.intersection(*(set(gc.rows) for _, gc in g.groupby("cell")))


def answer_text(frame, near: float = 1.5) -> str:
    """The sweep's answer in one sentence, from its cells: per engine, v(k) at the largest rows every cell
    stepped (up to 16), from the smallest to the largest value across the grid, and whether any cell's step
    behaves like a memory-bound one (v(k) within ``near`` of 1: extra rows almost free)."""
    if frame is None or not len(frame):
        return ""
    parts = []
    for eng, g in frame.groupby("engine", sort=False):
        ks = sorted(k for k in _rows_every_cell_stepped(g) if 1 < k <= 16)
        if not ks:
            continue
        k = ks[-1]
        at = g[g.rows == k].set_index("cell").v
        free = sorted(c for c, v in at.items() if v <= near)
        verdict = (f"near 1 (a memory-bound step) on {', '.join(free)}" if free else
                   f"above {near:g} on every cell, so no cell of the grid behaves as the source assumes")
        parts.append(f"with {eng}, a step of {k} rows costs {at.min():.3g} to {at.max():.3g} one-row steps "
                     f"across the {at.size} cells: {verdict}")
    return ("The answer, from the cells below: " + "; ".join(parts) + ".") if parts else ""


def _decisions(path: Path) -> dict[str, str]:
    """A chapter JSON's decision verdicts as the pages read them (``claims.load_chapter``: the registration
    applied, so an exploratory result reads as the tables print it), by claim id."""
    from studylib.claims import load_chapter

    try:
        return {v.id: v.verdict for v in load_chapter(path)["verdicts"] if v.role == "decision"}
    except Exception:  # noqa: BLE001 - one unreadable record must not take the page down
        return {}


def _model_words(name: Any) -> str:
    """Which weights a run used: the random stand-in in ``tables.model_words``'s words, else the trained model."""
    from studylib.workbook.tables import model_words

    text = model_words(name)
    return text if text != str(name) else f"{name}'s trained weights"


def disagreements(summary: dict[str, Any], sweep_dir: Path) -> list[str]:
    """For each cell whose decision on a claim differs from the main run's (the study's own chapter JSON two
    folders up), one sentence saying so and why, causes first: the weights (random at real shapes, or the
    trained model), the engine that decided the claim, the commit of the measuring code, then the names of
    the settings that differ (their values are in the grid and the appendix). Both sides are read the way
    the tables read them, so the sentence and the cells table agree on each verdict."""
    main_dir = Path(sweep_dir).parent.parent
    varying = list(summary.get("grid", {}))
    out = []
    for c in summary.get("cells", []):
        if c["status"] not in ("ok", "up to date"):
            continue
        main_path, cell_path = main_dir / f"ch{c['chapter']:02d}.json", Path(sweep_dir) / c["cell"] / f"ch{c['chapter']:02d}.json"
        if not (main_path.exists() and cell_path.exists()):
            continue
        ours, theirs = _decisions(cell_path), _decisions(main_path)
        differ = [k for k in ours if k in theirs and ours[k] != theirs[k]]
        if not differ:
            continue
        main, cell = (json.loads(p.read_text(encoding="utf-8")) for p in (main_path, cell_path))
        why = []
        mp, cp = main.get("params") or {}, cell.get("params") or {}
        if mp.get("model") != cp.get("model"):
            why.append(f"the cell runs {_model_words(cp.get('model'))}, the main run {_model_words(mp.get('model'))}")
        me = (main.get("measurements") or {}).get("decisive_engine")
        ce = (cell.get("measurements") or {}).get("decisive_engine")
        if me and ce and me != ce:
            why.append(f"the deciding engine is {ce} in the cell and {me} in the main run")
        mc = str((main.get("provenance") or {}).get("git_commit") or "")[:12]
        cc = str((cell.get("provenance") or {}).get("git_commit") or summary.get("commit") or "")[:12]
        if mc and cc and mc != cc:
            why.append(f"the cell's measuring code is commit {cc}, the main run's {mc}")
        other = sorted(k for k in set(mp) | set(cp) if k not in ("model", "profile") and mp.get(k) != cp.get(k))
        if other:
            why.append(f"{len(other)} {'setting differs' if len(other) == 1 else 'settings differ'} ({', '.join(other)}; values in the "
                       "grid above and each run's appendix)")
        verdicts = "; ".join(f"{k}: {ours[k]} here, {theirs[k]} in the main run" for k in differ)
        out.append(f"{_label(c.get('overrides', {}), varying)}: {verdicts}. Why they can differ: "
                   + ("; ".join(why) if why else "nothing in the two runs' records differs, so the difference is "
                      "the machine's between runs") + ".")
    return out


def _word(v: Any) -> str:
    """A parameter's value as words: a list as "a, b, c", anything else as itself."""
    return ", ".join(map(str, v)) if isinstance(v, list | tuple) else str(v)


def _params_words(params: Mapping[str, Any]) -> str:
    """The shared parameters as 'name = value' words, not JSON."""

    return "; ".join(f"{k} = {_word(v)}" for k, v in params.items())


def regime_text(frame) -> str:
    """One sentence per engine, formatted from the cells' step costs: how far v(k) moves across the grid at
    the largest rows every cell stepped, so a reader sees whether the regime depends on what the grid varies."""
    parts = []
    for eng, g in frame.groupby("engine", sort=False):
        ks = sorted(k for k in _rows_every_cell_stepped(g) if k > 1)[-2:]
        if not ks or g.cell.nunique() < 2:
            continue
        spans = []
        for k in ks:
            v = g[g.rows == k].v
            spans.append(f"v({k}) from {v.min():.3g} to {v.max():.3g}")
        parts.append(f"{eng}: {' and '.join(spans)} across the {g.cell.nunique()} cells")
    return ("Medians per cell, " + "; ".join(parts) + ".") if parts else ""


def _regime_figure(frame, path: Path, defects: list[str]) -> Path:
    """v(k) against rows per cell and engine: a memory-bound device keeps v near 1 while rows grow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    engines = list(dict.fromkeys(frame.engine))
    fig, axes = plt.subplots(1, len(engines), figsize=(5.2 * len(engines), 3.8), squeeze=False, sharey=True)
    for ax, eng in zip(axes[0], engines, strict=True):
        g = frame[frame.engine == eng]
        for cell, gc in g.groupby("cell", sort=False):
            gc = gc.sort_values("rows")
            line = ax.plot(gc.rows, gc.v, marker="o", label=cell)[0]
            if {"v_low", "v_high"} <= set(gc.columns):
                ax.fill_between(gc.rows, gc.v_low, gc.v_high, color=line.get_color(), alpha=0.2)
        top = float(frame.rows.max())
        ax.plot([1, top], [1, top], color="#999", ls=":", lw=1, label="v = rows (compute-bound)")
        ax.axhline(1.0, color="#222", lw=0.8, label="v = 1 (memory-bound)")
        ax.set(xscale="log", yscale="log", xlabel="rows in the step", title=eng)
    axes[0][0].set_ylabel("v(k): a k-row step in one-row steps")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    from studylib.plots import tidy

    tidy(fig)  # plain labels on the log axes
    return _save(fig, path, defects)


def write_sweep_page(sweep_dir: Path) -> Path:
    from studylib.workbook.book import badge, page

    sweep_dir = Path(sweep_dir)
    summary = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    varying = list(summary.get("grid", {}))
    esc = html.escape
    parts = [f"<p><a href='../../index.html'>&larr; the study</a></p><h1>Sweep: {esc(summary['name'])}</h1>"]
    ch01_cells = _chapter1_cells(summary, sweep_dir)
    steps = step_cost_frame(summary, sweep_dir, ch01_cells)
    answer = answer_text(steps)
    if answer or summary.get("description"):
        # the answer from the cells first, then the question it answers
        question = f" (The question: {summary['description']})" if summary.get("description") else ""
        parts.append(f"<p class='lead'>{esc((answer or 'No cell measured a step cost.') + question)}</p>")
    differ = disagreements(summary, sweep_dir)
    if differ:
        parts.append("<h2>Where a cell disagrees with the main run</h2><ul>"
                     + "".join(f"<li>{esc(d)}</li>" for d in differ) + "</ul>")
    grid = summary.get("grid", {})
    parts.append("<h2>The grid</h2><p>Profile <code>{}</code>, chapter{} {}; every combination below is one cell, one "
                 "run of the chapter with these parameters{}.</p>".format(
                     esc(summary["profile"]), "s" if len(summary["chapters"]) > 1 else "",
                     ", ".join(map(str, summary["chapters"])),
                     (" and the shared ones: " + esc(_params_words(summary["params"]))) if summary.get("params") else ""))
    if grid:
        parts.append("<div class='table-wrap'><table class='sweep'><tr><th>parameter</th><th>values</th></tr>"
                     + "".join(f"<tr><td>{esc(k)}</td><td>{esc(', '.join(map(str, v)))}</td></tr>" for k, v in grid.items())
                     + "</table></div>")
    rows = []
    for c in summary["cells"]:
        cell_dir = sweep_dir / c["cell"]
        nn = f"ch{c['chapter']:02d}"
        ok = c["status"] in ("ok", "up to date")
        page_name = f"{nn}.html" if ok else f"{nn}.failed.html"
        link = f"<a href='{esc(c['cell'])}/{page_name}'>{esc(_label(c.get('overrides', {}), varying))}</a>" \
            if (cell_dir / page_name).exists() else esc(_label(c.get("overrides", {}), varying))
        where = c.get("where") or {}
        verdicts = [v for v in _cell_verdicts(cell_dir, c["chapter"]) if v.role == "decision"] if ok else []
        vtext = "<br>".join(f"{esc(v.id)} {badge(v.verdict)} {esc(v.metric)}: {esc(_measure(v))}{esc(_why_exploratory(v))}"
                            for v in verdicts)
        status = c["status"] if c["status"] != "failed" else f"<span class='failed'>failed</span>: {esc(c.get('error') or '')}"
        rows.append(f"<tr><td>{link}</td><td>{nn}</td><td>{status}</td><td>{c.get('attempts', '')}</td>"
                    f"<td>{esc(str(where.get('cpu') or where.get('host', '')))}<br>{esc(str(where.get('device', '')))}, "
                    f"{'ISA path ' + esc(str(where['isa'])) if where.get('isa') else ''}</td>"
                    f"<td>{vtext or 'no verdict'}</td></tr>")
    parts.append("<h2>The cells</h2><div class='table-wrap'><table class='sweep'><tr><th>cell</th><th>chapter</th>"
                 "<th>status</th><th>attempts</th><th>ran on</th><th>verdicts (deciding number [95% CI], n)</th></tr>"
                 + "".join(rows) + "</table></div>")
    figs, defects = [], []
    for i, (name, pts) in enumerate(sorted(quantities(summary, sweep_dir).items())):
        f = _figure(name, pts, sweep_dir / f"quantity_{i:02d}.png", defects)
        figs.append(f"<figure><img src='{f.name}' alt='{esc(name)} across the grid'><figcaption>{esc(name)}: each "
                    "cell's measured value with its confidence interval; the dashed line is the claim's bar.</figcaption>"
                    "</figure>")
    if steps is not None and len(steps):
        f = _regime_figure(steps, sweep_dir / "regime.png", defects)
        figs.insert(0, f"<figure><img src='{f.name}' alt='step cost against rows per cell'><figcaption>The regime: "
                       "v(k), the cost of a step of k rows in one-row steps (median over interleaved repeats, 95% CI "
                       "band), per cell and engine. Near the v = 1 line the step is bound by reading the weights and "
                       "extra rows ride along; along the dotted line every row pays its own compute. "
                       f"{esc(regime_text(steps))}</figcaption></figure>")
    regime = regime_table(summary, sweep_dir, cells=ch01_cells)
    if regime:
        above = sorted({r["cell"] for r in regime if isinstance(r["_fraction"], int | float) and r["_fraction"] > 1})
        shown = [{k: v for k, v in r.items() if not k.startswith("_")} for r in regime]
        head = "".join(f"<th>{esc(k)}</th>" for k in shown[0])
        body = "".join("<tr>" + "".join(f"<td>{esc(str(v))}</td>" for v in r.values()) + "</tr>" for r in shown)
        caveat = (f"<p><b>A fraction above 1</b> ({esc(', '.join(above))}) means the decode step read its weights "
                  "faster than the bandwidth probe did: the probe of these runs understates this machine's "
                  "memory bandwidth, so those fractions are not fractions of a true bound.</p>") if above else ""
        parts.append("<h2>The regime, per cell</h2><p>v(k) is a k-row step's cost in one-row steps (1: the extra rows "
                     "ride on the weights already read; k: every row pays its own compute). The ridge is where the "
                     "roofline model, from the measured bandwidth and the kernel's measured peak, turns a step "
                     "compute-bound. The bandwidth fraction is the batch-1 decode step of the model in its loaded "
                     "precision (fp32 weights here): the bytes it must read per step over its time, against the "
                     "machine's measured bandwidth.</p>"
                     f"<div class='table-wrap'><table class='sweep'><tr>{head}</tr>{body}</table></div>{caveat}")
    if figs:
        parts.append("<h2>Across the grid</h2>" + "".join(figs))
    # The same log a chapter's figures leave (studylib.workbook.figure_check), read by the book's tests.
    atomic_write(sweep_dir / "figures.json", json.dumps({"figures": len(figs), "defects": defects}, indent=1,
                                                         ensure_ascii=False))
    parts.append(f"<p class='meta'>Measured at commit {esc(str(summary.get('commit', ''))[:12])}, updated {esc(summary.get('updated', ''))}"
                 f", {esc(str(summary.get('seconds', '')))} s of sweep wall time.</p>")
    return atomic_write(sweep_dir / "index.html", page(f"Sweep {summary['name']}", "".join(parts), _CSS))


def sweeps_block(profile_dir: Path) -> str:
    """The front page's list of sweeps (empty when there is none)."""
    items = []
    for d in sweep_dirs(profile_dir):
        s = json.loads((d / "sweep.json").read_text(encoding="utf-8"))
        ok = sum(c["status"] in ("ok", "up to date") for c in s["cells"])
        items.append(f"<li><a href='sweeps/{html.escape(d.name)}/index.html'>{html.escape(s['name'])}</a>: "
                     f"{len(s['cells'])} cells ({ok} with results)"
                     + (f". {html.escape(s['description'])}" if s.get("description") else "") + "</li>")
    return "<ul>" + "".join(items) + "</ul>" if items else ""

