"""The front page, ``index.html``: what the source document claims, what was run, the bottom line
written from the verdicts, one line per claim, a figure of claimed vs measured, the chapters, search,
and how to rerun. Every number on it is formatted from a chapter's JSON; the prose around them is
fixed text that states no measurement of its own."""

from __future__ import annotations

import dataclasses
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studylib.bench.provenance import commit_label
from studylib.claims import (
    CLAIMS,
    CONDITIONAL,
    DECISION,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    SOURCE_TITLE_EN,
    SOURCE_TITLE_ZH,
    Verdict,
    load_chapter,
    load_verdicts,
    shown_metric,
    study_decisions,
    verdict_table,
)
from studylib.errors import StudylibError
from studylib.workbook import why as why_model
from studylib.workbook.book import (
    DIRTY_NOTE,
    arithmetic_words,
    badge,
    bar_ratio,
    bar_with_origin,
    metric_where,
    page,
    verdict_number,
    weakest_first,
    zh,
)
from studylib.workbook.paths import atomic_write

_FRONT_CSS = """
.lead { font-size: 1.08em; } .meta { color: #555; font-size: 0.9em; }
table.claims, table.chapters { border-collapse: collapse; width: 100%; font-size: 0.9em; }
table.claims th, table.claims td, table.chapters th, table.chapters td { text-align: left; vertical-align: top;
       padding: 5px 7px; border-top: 1px solid #ddd; }
table.claims th, table.chapters th { background: #f0f0f0; }
/* the claims table's prose columns share the width; the deciding number gets as much as the claim */
table.claims th:nth-child(2) { width: 22%; } table.claims th:nth-child(4) { width: 28%; }
table.claims th:nth-child(5) { width: 28%; }
.table-wrap { max-width: 100%; overflow-x: auto; }
blockquote.source { border-left: 3px solid #0b5cad; background: #f7f9fc; margin: 0.6em 0; padding: 0.4em 1em; }
#search { width: 100%; max-width: 30em; padding: 4px 6px; font-size: 1em; }
#hits li { margin: 0.3em 0; } #hits .where { color: #555; font-size: 0.9em; }
pre.cmd { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 4px; padding: 8px 10px; overflow-x: auto;
       font-size: 0.85em; }
details.all summary { cursor: pointer; font-weight: bold; }
.print-only { display: none; }
table.card { border-collapse: collapse; font-size: 0.88em; } table.card td, table.card th { padding: 3px 7px;
       border-top: 1px solid #ddd; text-align: left; vertical-align: top; } table.card th { background: #f0f0f0; }
"""

_SEARCH_JS = """
const box = document.getElementById('search'), hits = document.getElementById('hits');
const index = JSON.parse(document.getElementById('search-index').textContent);
function esc(s) { return s.replace(/[&<>"']/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'})[c]); }
box.addEventListener('input', () => {
  const q = box.value.trim().toLowerCase();
  hits.innerHTML = '';
  if (q.length < 2) return;
  let shown = 0;
  for (const e of index) {
    const at = e.text.toLowerCase().indexOf(q);
    if (at < 0) continue;
    const snip = e.text.slice(Math.max(0, at - 60), at + q.length + 80);
    hits.insertAdjacentHTML('beforeend', `<li><a href="${e.href}">${esc(e.chapter)}</a> <span class="where">` +
      `${esc(e.heading)}</span><br>…${esc(snip)}…</li>`);
    if (++shown >= 25) break;
  }
  if (!shown) hits.innerHTML = '<li>No match.</li>';
});
"""


def _saved(out: Path) -> dict[int, dict[str, Any]]:
    """Every chapter's saved JSON in ``out``, read once, by chapter number."""
    return {int(f.stem[2:]): json.loads(f.read_text(encoding="utf-8")) for f in sorted(out.glob("ch[0-9][0-9].json"))}


def _machine(p: Mapping[str, Any]) -> str:
    isa = p.get("isa", {}).get("label") if isinstance(p.get("isa"), Mapping) else p.get("isa")
    if p.get("gpu"):
        return f"GPU {p['gpu']}"
    return f"{p.get('cpu')} ({p.get('cpu_count')} cores" + (f", ISA {isa})" if isa else ")")


def _chapters_words(chs: Sequence[int]) -> str:
    chs = sorted(chs)
    if len(chs) == 1:
        return f"chapter {chs[0]}"
    return "chapters " + ", ".join(map(str, chs[:-1])) + f" and {chs[-1]}"


def what_was_run(out: Path, index: Mapping[str, Any]) -> str:
    saved = _saved(out)
    provs = {ch: d["provenance"] for ch, d in saved.items() if d.get("provenance")}
    if not provs:
        return "<p>No chapter has run yet: <code>make reproduce</code> runs them all.</p>"
    dates = sorted(str(x.get("date", ""))[:10] for x in provs.values() if x.get("date"))
    commits = sorted({commit_label(x) for x in provs.values() if x.get("git_commit")})
    params: dict[str, Any] = {}
    for data in saved.values():  # the first chapter that names each setting
        for k, v in (data.get("params") or {}).items():
            params.setdefault(k, v)
    model = params.get("model", "the embedded model")
    machines: dict[str, list[int]] = {}
    for ch, prov in sorted(provs.items()):
        machines.setdefault(_machine(prov), []).append(ch)
    if len(machines) == 1:
        where = f"on {html.escape(next(iter(machines)))}"
    else:  # chapters rerun on another machine: say which ran where, so no reader compares across machines unawares
        where = "on more than one machine (" + "; ".join(
            f"{_chapters_words(chs)} on {html.escape(m)}" for m, chs in machines.items()) + \
            "; each chapter compares its arms on its own machine, and its page names that machine)"
    torch_versions = sorted({str((x.get("versions") or {}).get("torch")) for x in provs.values()})
    seconds = sum(float(r.get("seconds") or 0) for r in (index.get("chapters") or {}).values())
    when = dates[0] if dates and dates[0] == dates[-1] else (f"{dates[0]} to {dates[-1]}" if dates else "")
    arithmetic: dict[str, list[int]] = {}
    for ch, data in sorted(saved.items()):
        # a chapter without one arithmetic (chapter 8 compares formats) says so
        arithmetic.setdefault(arithmetic_words(data.get("params") or {}) or "each format it compares", []).append(ch)
    if len(arithmetic) == 1:
        how = html.escape(next(iter(arithmetic)))
    else:  # chapters 2, 3, 5 and 7 run the GGUF engine with int8 activations, the rest float32
        how = "; ".join(f"{html.escape(a)} in {_chapters_words(chs)}" for a, chs in arithmetic.items())
    return (f"<p>Every chapter ran the model <b>{html.escape(str(model))}</b> "
            f"({how}) {where}, "
            f"profile <b>{html.escape(str(index.get('profile')))}</b>, {html.escape(when)}, "
            f"measured at commit{'s' * (len(commits) > 1)} {', '.join(f'<code>{html.escape(c)}</code>' for c in commits)}; "
            f"torch {html.escape(', '.join(torch_versions))}. The chapters took "
            f"{_duration(seconds)} in all (each chapter's time is in the table below).</p>"
            + _native_format_note(str(model), 8 in saved))


def _native_format_note(model: str, compression_ran: bool) -> str:
    """For the embedded model: it is distributed in 4-bit, so what chapter 8 can and cannot measure."""
    from studylib.models.weights import check_weights

    try:
        embedded = check_weights("gguf", model) == "gguf"
    except StudylibError:
        embedded = False
    if not embedded:
        return ""
    return ("<p>The model is distributed in 4-bit: its GGUF file stores the linear layers as Q4_1 blocks, and the "
            "study's fp32 model is those blocks widened. Its loss against a bf16 original therefore cannot be "
            "measured here" + ("; chapter 8 measures instead the speed of keeping the native format and the loss "
                               "of compressing further or changing the arithmetic" if compression_ran else "")
            + ".</p>")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} seconds" if seconds < 90 else f"{seconds / 60:.0f} minutes"


def _c7_parts(verdicts: Sequence[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.id == "C7" and v.role != DECISION]


def bottom_line(verdicts: Sequence[Verdict]) -> str:
    """A paragraph written from the decisions: how many claims hold, which, and the headline's parts."""
    decisions = study_decisions(verdicts)
    if not decisions:
        return "<p>No verdicts yet.</p>"
    names = {k: [d.id for d in decisions if d.verdict == k] for k in (HOLDS, CONDITIONAL, INCONCLUSIVE, FAILS)}

    def group(k: str, one: str, many: str) -> str:
        ids = names[k]
        return f"{len(ids)} {one if len(ids) == 1 else many} ({', '.join(ids)})" if ids else ""

    summary = ", ".join(g for g in (group(HOLDS, "holds", "hold"),
                                    group(CONDITIONAL, "holds only under stated conditions",
                                          "hold only under stated conditions"),
                                    group(INCONCLUSIVE, "is inconclusive", "are inconclusive"),
                                    group(FAILS, "does not hold", "do not hold")) if g)
    text = (f"<p>Of the {len(decisions)} claims measured here, {summary}. A claim holds only where the "
            "confidence interval of its measurement (95%, or wider where several configurations were tried for one "
            "decision) clears its bar: the essay's own number where it gives one "
            "(more than 99% of quality kept, latency cut more than tenfold, throughput up 8 to 12 times), "
            "otherwise a bar this study chose and declared before the run (each chapter's decision names it, "
            "such as 2x for \"substantially\"). Where some configurations clear it and others do not, it holds "
            "under conditions, and those conditions are named beside it.</p>")
    c7 = next((d for d in decisions if d.id == "C7"), None)
    parts = _c7_parts(verdicts)
    if c7 is not None and parts:
        items = "".join(f"<li>{html.escape(metric_where(p))}: {html.escape(verdict_number(p))} {badge(p.verdict)}</li>"
                        for p in weakest_first(parts))
        text += (f"<p>The headline (C7: over 99% of quality kept, end-to-end latency cut more than tenfold, "
                 f"throughput up 8 to 12 times) is judged by its weakest part: {badge(c7.verdict)}. Its parts, "
                 f"weakest first:</p><ul>{items}</ul>")
    return text


def claims_table(verdicts: Sequence[Verdict], chapters: Mapping[int, str]) -> str:
    rows = []
    # a claim decided over several chapters shows the chapter whose decision the study's verdict took
    # (claim_rows), so its number sits under its own verdict
    shown = claim_rows(verdicts)
    took = {d.id: d.chapter for d, _ in shown}
    carried = {d.id: p for d, p in shown}
    for d in study_decisions(verdicts):
        claim = CLAIMS.get(d.id)
        chs = sorted({v.chapter for v in verdicts if v.id == d.id and v.role == DECISION})
        links = ", ".join(f"<a href='ch{c:02d}.html'>{c}</a>" if c in chapters else str(c) for c in chs)
        decided = f"{html.escape(shown_metric(d))}: {html.escape(verdict_number(d))}"
        if not (isinstance(d.measured, int | float) and not isinstance(d.measured, bool)):
            # a decision over parts: the reader needs the number that decided it, the weakest counted part
            numeric = [v for v in verdicts if v.id == d.id and v.role != DECISION and not v.by_construction
                       and _has_bar(v) and v.chapter == took.get(d.id, v.chapter)]
            p = carried.get(d.id)
            if d.verdict in (HOLDS, CONDITIONAL) and p is not None and p in numeric:
                # a hold is carried by a part that holds (the claims figure's row), never by one that failed
                decided += (f"<br><small>carried by: {html.escape(metric_where(p))} = "
                            f"{html.escape(verdict_number(p))} against the bar "
                            f"{html.escape(bar_with_origin(p))} (chapter {p.chapter})</small>")
            elif numeric:
                # weakest: the worst verdict, then the CI's end nearest its bar (as a multiple of the bar)
                w = weakest_first(numeric)[0]
                decided += (f"<br><small>weakest part: {html.escape(metric_where(w))} = "
                            f"{html.escape(verdict_number(w))} against the bar "
                            f"{html.escape(bar_with_origin(w))} (chapter {w.chapter})</small>")
        if factor := why_model.deciding_factor(d.id):
            decided += f"<br><small>what decides it here: {html.escape(factor)}</small>"
        rows.append(f"<tr><td><b>{d.id}</b></td><td>{html.escape(claim.text if claim else d.claim)}</td>"
                    f"<td>{badge(d.verdict)}</td><td>{decided}</td><td>{html.escape(d.conditions or '')}</td>"
                    f"<td>{links}</td></tr>")
    return ("<div class='table-wrap'><table class='claims'><tr><th>claim</th><th>what the document says</th>"
            "<th>verdict</th><th>decided by</th><th>conditions</th><th>chapter</th></tr>"
            + "".join(rows) + "</table></div>")


def _has_bar(v: Verdict) -> bool:
    """A row with a number and a bar to hold it to (not a check, not a count of parts)."""
    return isinstance(v.measured, int | float) and not isinstance(v.measured, bool) and v.threshold is not None


def _configurations(parts: Sequence[Verdict]) -> dict[str, bool]:
    """The configurations a decision's rows name (``q8_0: >= 2x AND >99% quality``: a check row whose metric
    starts with the configuration's name), each with whether it counts and holds."""
    out = {}
    for p in parts:
        name, sep, _ = p.metric.partition(": ")
        if sep and p.threshold is None and name and " " not in name:
            out[name] = p.verdict in (HOLDS, CONDITIONAL) and not p.by_construction
    return out


def _configuration_of(part: Verdict, configs: Mapping[str, bool]) -> str | None:
    """The configuration a part measures (its metric ends ", <name>"), if any."""
    return next((n for n in configs if part.metric.endswith(", " + n)), None)


def deciding_rows(verdicts: Sequence[Verdict]) -> list[tuple[Verdict, Verdict]]:
    """(decision, the part that decided it) for every claim and chapter, in claim order. The part is the one
    whose verdict the decision took: for a decision that holds (or holds under conditions), the holding part
    furthest past its bar; otherwise the weakest part with the decision's verdict. Parts that hold by
    construction never decide. A decision without counted parts stands for itself."""
    out = []
    for d in sorted((v for v in verdicts if v.role == DECISION), key=lambda v: (int(v.id[1:]), v.chapter)):
        parts = [p for p in verdicts if p.role != DECISION and p.id == d.id and p.chapter == d.chapter
                 and not p.by_construction]
        want = HOLDS if d.verdict in (HOLDS, CONDITIONAL) else d.verdict
        conditional = [p for p in parts if p.verdict == CONDITIONAL] if d.verdict == CONDITIONAL else []
        if conditional:
            # a part that itself holds only under conditions gave the decision its verdict (C4's eviction
            # ratio, beside an exactness check that holds outright): that part is the row, as in the table
            out.append((d, weakest_first(conditional)[0]))
            continue
        same = [p for p in parts if p.verdict == want]
        if want == HOLDS:
            # a hold is carried by a configuration that holds: a part that holds inside a configuration that
            # does not (kv_int8's quality, when its speed fails) or that is not counted carries nothing
            configs = _configurations([v for v in verdicts if v.role != DECISION and v.id == d.id
                                       and v.chapter == d.chapter])
            same = [p for p in same if (c := _configuration_of(p, configs)) is None or configs[c]]
        if not same:
            if not parts:
                out.append((d, d))
                continue
            # no part took the decision's verdict (an exploratory decision reads inconclusive whatever its
            # parts say): the weakest counted part, as the claims table names it, so figure and table agree
            out.append((d, _weakest(parts)))
            continue
        if want != HOLDS:
            # the weakest part with the decision's verdict, ordered as the claims table orders it (worst
            # verdict, then the CI's end nearest its bar), so the figure's row is the table's "weakest part"
            out.append((d, _weakest(same)))
            continue
        ratio = {id(p): (bar_ratio(p) or (float("nan"),))[0] for p in same}
        ranked = sorted(same, key=lambda p: (math.isnan(ratio[id(p)]), ratio[id(p)]))
        numeric = [p for p in ranked if not math.isnan(ratio[id(p)])]
        # the holding part furthest past its bar; a check beside it (a configuration's own row, no bar) once
        # sorted last and handed the row to the part nearest its bar
        out.append((d, numeric[-1] if numeric else ranked[0]))
    return out


def _weakest(rows: Sequence[Verdict]) -> Verdict:
    """The claims table's "weakest part" among ``rows``: rows with a number and a bar first, then the worst
    verdict and the CI end nearest its bar (``weakest_first``)."""
    return weakest_first([p for p in rows if _has_bar(p)] or list(rows))[0]


def claim_rows(verdicts: Sequence[Verdict]) -> list[tuple[Verdict, Verdict]]:
    """One (decision, deciding part) per claim: the study's decision (``study_decisions``) and the part that
    carried it. A claim decided over several chapters (C3, C8) is shown by the chapter whose decision took the
    study's verdict (for a hold under conditions, a chapter where it holds)."""
    from studylib.claims import study_decisions

    per = deciding_rows(verdicts)
    out = []
    for study in study_decisions(verdicts):
        mine = [(d, p) for d, p in per if d.id == study.id]
        if len(mine) <= 1:
            out.extend(mine)
            continue
        want = HOLDS if study.verdict in (HOLDS, CONDITIONAL) else study.verdict
        pick = next((m for m in mine if m[0].verdict == want), None) or \
            next((m for m in mine if m[0].verdict == study.verdict), mine[0])
        out.append((dataclasses.replace(study, chapter=pick[0].chapter), pick[1]))
    return out


# The figure's width in inches: the print edition shows it across an A4 text block (7.3 in), so its 9 pt
# labels print at 9 pt; it is saved at this size (no tight bounding box that would grow it and shrink the text).
CLAIMS_FIGURE_IN = 7.2


def claims_figure(verdicts: Sequence[Verdict], path: Path) -> Path | None:
    """One row per claim: the part that decided it, as measured ÷ its bar on a log axis with its CI as
    whiskers, coloured by the study's verdict (the vertical line at 1 is the bar). A part that is a check
    (all or nothing, no bar) stands at 1 as a square. Labels are whole, wrapped rather than cut."""
    import textwrap

    rows = claim_rows(verdicts)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    sns.set_theme(style="whitegrid", context="notebook")
    colours = {HOLDS: "#1a7f37", CONDITIONAL: "#9a6700", INCONCLUSIVE: "#6e6e9e", FAILS: "#c33"}
    labels = [textwrap.fill(f"{d.id} (chapter {p.chapter}), {d.verdict}: {shown_metric(p)}", 52)
              for d, p in rows]
    fig, ax = plt.subplots(figsize=(CLAIMS_FIGURE_IN,
                                    sum(0.24 * (lb.count(chr(10)) + 1) + 0.14 for lb in labels) + 1.6))
    for i, (d, p) in enumerate(rows):
        colour = colours.get(d.verdict, "#555")
        r = bar_ratio(p)
        if r is None:
            ax.plot(1.0, i, marker="s", mfc="white", mec=colour, mew=2, ms=8, ls="")
        else:
            m, lo, hi = r
            ax.errorbar(m, i, xerr=[[m - lo], [hi - m]], fmt="o", color=colour, capsize=3)
    ax.set_yticks(range(len(rows)), labels, fontsize=9)
    ax.invert_yaxis()
    ax.axvline(1.0, color="#222", lw=1)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())  # minor ticks unlabelled: their labels collided
    ax.set_xlabel("the deciding part, measured ÷ its bar\n(right of the line: bar met; whiskers: its CI;\n"
                  "a square: a check, no bar)")
    shown = {d.verdict for d, _ in rows}
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=k) for k, c in colours.items() if k in shown]
    # the key sits in a strip kept free at the bottom, inside the figure (it is saved at its own size)
    strip = 0.35 / fig.get_figheight()
    fig.tight_layout(rect=(0, strip, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, 0.0))
    # The book's figure check reads it like a chapter's figure; its findings land beside it, and the
    # tests read the committed ones.
    from studylib.workbook.figure_check import figure_defects

    atomic_write(Path(path).with_suffix(".figures.json"),
                 json.dumps({"figures": 1, "defects": figure_defects(fig)}, indent=1, ensure_ascii=False))
    fig.savefig(path, dpi=110)  # at its own size: see CLAIMS_FIGURE_IN
    plt.close(fig)
    return path


def shorten_middle(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters by dropping words from its middle, keeping both ends."""
    if len(text) <= width:
        return text
    keep = (width - 3) // 2
    head = text[:keep].rsplit(" ", 1)[0] if " " in text[:keep] else text[:keep]
    tail = text[-keep:].split(" ", 1)[-1] if " " in text[-keep:] else text[-keep:]
    return f"{head} … {tail}"


def chapters_table(out: Path, index: Mapping[str, Any], chapters: Sequence[tuple[int, str]],
                   notebooks: Mapping[int, Path] | None = None) -> str:
    """One row per chapter that ran, failed or exists as a notebook: its verdicts, status and time."""
    records = index.get("chapters", {})
    titles = dict(chapters)
    for c, nb in (notebooks or {}).items():
        titles.setdefault(c, nb.stem.split("_", 1)[-1].replace("_", " ").capitalize())
    numbers = sorted({*titles, *(int(k) for k in records), *(int(p.stem[2:]) for p in out.glob("ch[0-9][0-9].json"))})
    rows = []
    for c in numbers:
        nn = f"ch{c:02d}"
        rec = records.get(str(c)) or {}
        data = load_chapter(out / f"{nn}.json") if (out / f"{nn}.json").exists() else None
        title = titles.get(c) or (data or {}).get("title") or f"Chapter {c}"
        badges = " ".join(badge(v.verdict, f"{v.id}: {v.verdict}") for v in (data["verdicts"] if data else [])
                          if v.role == DECISION)
        secs = rec.get("seconds")
        status = rec.get("status", "ok" if data else "not run")
        if status == "failed":
            status = f"failed: {rec.get('error', '')}" + (" (the page and verdicts shown are from the last "
                                                          "successful run)" if data else "")
        dirty = " (dirty tree)" if rec.get("dirty_tree") else ""
        page_name = next((n for n in (f"{nn}.html", f"{nn}.failed.html") if (out / n).exists()), None)
        link = f"<a href='{page_name}'>{html.escape(title)}</a>" if page_name else html.escape(title)
        files = " · ".join(f"<a href='{n}'>{label}</a>" for n, label in
                           ((f"{nn}.ipynb", "notebook"), (f"{nn}.json", "data"), (f"{nn}.failed.html", "failed run"))
                           if (out / n).exists())
        took = "" if not isinstance(secs, int | float) else (f"{secs / 60:.1f} min" if secs >= 60 else f"{secs:.0f} s")
        rows.append(f"<tr><td>{c}</td><td>{link}</td><td>{badges}</td><td>{html.escape(status)}{dirty}</td>"
                    f"<td>{took}</td><td>{files}</td></tr>")
    return ("<div class='table-wrap'><table class='chapters'><tr><th>#</th><th>chapter</th><th>verdicts</th>"
            "<th>status</th><th>time</th><th>files</th></tr>" + "".join(rows) + "</table></div>")


def search_index(chapters: Sequence[tuple[int, str]], executed: Mapping[int, Any]) -> list[dict[str, str]]:
    """Markdown cells of every chapter, each under its nearest heading, for the page's search box."""
    entries = []
    for c, title in chapters:
        nb = executed[c]
        heading = title
        for cell in nb.cells:
            if cell.cell_type != "markdown":
                continue
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    heading = line.lstrip("#").strip()
            text = " ".join(cell.source.split())
            if text:
                entries.append({"chapter": f"{c}. {title}", "href": f"ch{c:02d}.html", "heading": heading,
                                "text": text})
    return entries


def instrument_block(out: Path, executed: Mapping[int, Any] | None = None) -> str:
    from studylib.workbook import instrument

    return instrument.block(out, found=instrument.card(out, executed))


def _why(out: Path) -> tuple[str, str]:
    """The "why" section and its one-line summary. The front page is rewritten after every chapter while
    a study runs, so a page block that cannot be drawn (a result missing a field it reads) is left out
    with a warning rather than stopping the run."""
    import sys

    try:
        rows = why_model.factors(out)  # read once for both
        return why_model.block(out, rows=rows), why_model.one_line(out, rows)
    except (KeyError, TypeError, ValueError, StudylibError) as exc:
        print(f"studylib: warning: the front page's 'why' section was left out: {exc}", file=sys.stderr)
        return "", ""


def write_front_page(out: Path, index: Mapping[str, Any], chapters: Sequence[tuple[int, str]] | None = None,
                     notebooks: Mapping[int, Path] | None = None, executed: Mapping[int, Any] | None = None) -> Path:
    """``<out>/index.html``; ``chapters`` (number, title) default to the executed notebooks in ``out``
    (``executed``, when the caller has read them already), ``notebooks`` name the chapters that have not
    run yet."""
    from studylib.workbook.book import chapter_list, executed_notebooks

    executed = executed_notebooks(out) if executed is None else executed
    chapters = chapter_list(out, executed) if chapters is None else chapters
    verdicts = load_verdicts(out)
    chapter_titles = dict(chapters)
    c7 = CLAIMS["C7"]
    records = index.get("chapters", {})
    dirty = [int(k) for k, rec in sorted(records.items(), key=lambda kv: int(kv[0])) if rec.get("dirty_tree")]
    fig = claims_figure(verdicts, out / "claims_vs_measured.png")
    parts = [
        "<h1>Fast LLM inference: a reproducible study</h1>",
        "<p class='lead'>A Chinese essay on fast inference for large language models claims that parallel and "
        "speculative decoding, computation compression, prefix-tree caching, dynamic batching and sparse or "
        "memory-augmented attention keep more than 99% of generation quality while cutting latency more than "
        "tenfold and raising throughput 8 to 12 times. Each chapter of this study implements one of those "
        "techniques for real, measures it against a named baseline on the same machine, and states whether the "
        "claim holds by a fixed rule.</p>",
    ]
    if dirty:
        parts.append(f"<div class='studylib-dirty'><b>Dirty tree:</b> chapter{'s' * (len(dirty) > 1)} "
                     f"{', '.join(map(str, dirty))}. {html.escape(DIRTY_NOTE)}</div>")
    bottom = bottom_line(verdicts)
    first, _, rest = bottom.partition("</p>")
    why, line = _why(out)
    parts += [
        # The verdicts come first: a reader's first screen should end on them, not mid-way through the setting.
        "<h2>The verdicts</h2>", first + "</p>", line,
        claims_table(verdicts, chapter_titles),
        "<p>One decision per claim. A claim with parts that must all hold (C6, C7) is decided by its weakest part "
        "on one configuration; a claim tested in two chapters takes each chapter as a condition.</p>",
        rest,
        *(["<h2 id='why'>Why: one model, this run's factors and the papers'</h2>", why] if why else []),
        # the card stands under the why: the model's v(k), c and step are its lines
        *(["<h2 id='instrument'>The instrument card</h2>",
           "<p>The numbers of the machine that every verdict rests on, each from the chapter that measured it, beside "
           "its engine, context and how it was measured (the same lines are saved as data beside this page). The "
           "same kind of number differs between chapters because the engine, the arithmetic or the context "
           "differs; a line that says &ldquo;one process&rdquo; is a repeat inside one run, not a whole run.</p>",
           card] if (card := instrument_block(out, executed)) else []),
        "<h2>What the source document says</h2>",
        f"<p>The source is a short essay in Chinese, “{zh(SOURCE_TITLE_ZH)}” "
        f"(<i>{html.escape(SOURCE_TITLE_EN)}</i>), on designing fast inference for large language models, from "
        "token-by-token (autoregressive) decoding to parallel decoding. Its headline:</p>",
        f"<blockquote class='source'><p>{zh(c7.quote_zh)}</p><p><i>{html.escape(c7.text)}</i></p></blockquote>",
        "<p>The essay makes nine claims in all (C1 to C9 above): from why token-by-token decoding is slow, through "
        "what each technique does, to the headline. Each is stated in the essay's words and in English at "
        "the top of the chapter that tests it.</p>",
        "<h2>What was run</h2>", what_was_run(out, index),
    ]
    if fig is not None:
        parts += ["<h2>Claimed against measured</h2>",
                  f"<p><img src='{fig.name}' alt='Each measured row as a multiple of its claimed bar, with its 95% "
                  "confidence interval'></p>"]
    from studylib.sweep.page import sweeps_block

    sweeps = sweeps_block(out)
    parts += [
        "<h2>The chapters</h2>", chapters_table(out, index, chapters, notebooks),
        *(["<h2>Sweeps</h2><p>Chapters rerun across a grid of settings (<code>studylib sweep</code>), side by side:</p>",
           sweeps] if sweeps else []),
        "<h2>Search the chapters</h2>",
        "<p><input id='search' type='search' placeholder='a word or phrase, e.g. radix, Quest, TTFT'></p>"
        "<ul id='hits'></ul>",
        "<script type='application/json' id='search-index'>"
        + json.dumps(search_index(chapters, executed), ensure_ascii=False).replace("</", "<\\/") + "</script>",
        "<h2>Rerun it</h2>",
        "<p>On a CPU, with the embedded model (each chapter takes about as long as the table above says; a first run "
        "also installs the packages and unpacks the model and data; chapter 2 reads the draft head shipped with the "
        "study and trains nothing unless asked):</p>"
        "<pre class='cmd'>git clone &lt;this repository&gt; &amp;&amp; cd studylib\nmake reproduce   "
        "# writes reports/cpu/, this page included</pre>"
        "<p>On your own GPU and model (a Hugging Face id or a local path), one chapter or all:</p>"
        "<pre class='cmd'>.venv/bin/studylib reproduce --profile gpu -p model=&lt;hf-id-or-path&gt; -p device=cuda\n"
        ".venv/bin/studylib reproduce --profile gpu --chapters 5 -p model=&lt;hf-id-or-path&gt; -p device=cuda\n"
        ".venv/bin/studylib book --profile cpu   # re-render these pages from the executed notebooks</pre>"
        "<p>The whole study on one page, for printing: <a href='book.html'>book.html</a>"
        + (" (and <a href='book.pdf'>book.pdf</a>)" if (out / "book.pdf").exists() else "") + ".</p>",
    ]
    if verdicts:
        table = verdict_table(verdicts)
        parts.append("<details class='all'><summary>Every verdict of every chapter, with its parts</summary>"
                     "<div class='table-wrap'>" + table.to_html() + "</div></details>")
        # the printed book carries every row too, without the columns its chapter pages print beside it
        compact = table.hide(subset=["claimed", "conditions"], axis="columns")
        parts.append("<div class='print-only'><h2>Every verdict of every chapter</h2><p>Every row, with its "
                     "measurement, bar and verdict; each row's conditions are printed with its chapter's verdict "
                     "table.</p><div class='table-wrap'>" + compact.to_html() + "</div></div>")
    return atomic_write(out / "index.html", page("Fast LLM inference: a reproducible study", "".join(parts),
                                                 _FRONT_CSS, _SEARCH_JS))
