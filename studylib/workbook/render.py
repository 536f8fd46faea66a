"""HTML for readers: executed notebooks via nbconvert, and the study's index page."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from studylib.bench.provenance import commit_label
from studylib.claims import load_chapter, load_verdicts, study_decisions, verdict_table
from studylib.workbook.paths import atomic_write

# A light page around nbconvert's "basic" template (the "lab" template embeds ~280 KB of CSS).
# The banner on a page made from a dirty git tree (chapter pages and the index).
_DIRTY_CSS = ".studylib-dirty { background: #fff1c2; border: 1px solid #9a6700; padding: 0.6em 1em; margin: 1em 0; }\n"
_NOTEBOOK_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, "PingFang SC", "Noto Sans CJK SC",
       "Microsoft YaHei", "WenQuanYi Micro Hei", sans-serif; max-width: 1000px; margin: 1.5em auto;
       padding: 0 1em; color: #222; line-height: 1.5; }
nav { font-size: 0.9em; margin-bottom: 1em; } a { color: #0b5cad; }
.cell { margin: 0.7em 0; } .anchor-link { display: none; }
.input_area pre { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 4px; padding: 8px 10px;
       font-size: 0.85em; overflow-x: auto; margin: 0; }
.celltag_injected-parameters .input_area pre { border-left: 3px solid #0b5cad; }
.celltag_injected-parameters .input_area::before { content: "parameters injected for this run";
       font-size: 0.75em; color: #0b5cad; }
.output_area pre { font-size: 0.82em; padding: 2px 10px; margin: 0.3em 0; white-space: pre-wrap; }
.output_stderr pre { background: #fff5f5; }
.output_wrapper { overflow-x: auto; }
.output_png img { max-width: 100%; height: auto; }
.rendered_html table { border-collapse: collapse; font-size: 0.85em; margin: 0.4em 0; }
.rendered_html th, .rendered_html td { padding: 3px 8px; border-bottom: 1px solid #ddd; }
.rendered_html thead th { background: #f0f0f0; }
blockquote { border-left: 3px solid #ccc; margin: 0.5em 0; padding: 0.1em 1em; color: #444; background: #fafafa; }
code { font-size: 0.9em; background: #f3f3f3; padding: 0 3px; border-radius: 3px; }
pre code { background: none; padding: 0; }
.ansi-red-fg { color: #c33; } .ansi-green-fg { color: #1a7f37; } .ansi-blue-fg { color: #0b5cad; }
.ansi-cyan-fg { color: #0a8a8a; } .ansi-yellow-fg { color: #9a6700; } .ansi-bold { font-weight: bold; }
.studylib-error { background: #f8d4d4; border: 1px solid #c33; padding: 0.6em 1em; margin: 1em 0;
       font-family: monospace; white-space: pre-wrap; }
""" + _DIRTY_CSS
DIRTY_NOTE = ("Made from a git tree with uncommitted changes to tracked files: these results belong to no "
              "commit, not even the one named here.")


def _page(title: str, body: str, css: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
            f"<style>{css}</style></head><body>{body}</body></html>")


def _notebook_title(nb: Any, default: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return default


def render_html(nb: Any | None, error: str | None = None, title: str = "chapter", dirty: bool = False) -> str:
    """One light, self-contained HTML page of an executed notebook (no In/Out prompts, figures as the
    PNGs the notebook produced); with an error banner on top for a failed run (``nb`` may be None if
    execution never started), and a note on top when it was made from a dirty git tree (``dirty``)."""
    from pygments.formatters import HtmlFormatter

    nav = "<nav><a href='index.html'>&larr; all chapters and verdicts</a></nav>"
    banner = (f"<div class='studylib-error'><b>This chapter failed; the outputs below are partial.</b>\n"
              f"{html.escape(error)}</div>") if error else ""
    if dirty:
        banner = f"<div class='studylib-dirty'><b>Dirty tree.</b> {html.escape(DIRTY_NOTE)}</div>" + banner
    css = _NOTEBOOK_CSS + HtmlFormatter(style="default").get_style_defs(".highlight")
    if nb is None:
        return _page(title, nav + banner, css)
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="basic")
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    body, _ = exporter.from_notebook_node(nb)
    return _page(_notebook_title(nb, title), nav + banner + body, css)


_INDEX_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, "PingFang SC", "Noto Sans CJK SC",
       "Microsoft YaHei", "WenQuanYi Micro Hei", sans-serif; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.25em; margin-top: 1.6em; }
.meta { color: #666; font-size: 0.9em; }
table.chapters { border-collapse: collapse; width: 100%; font-size: 0.9em; }
table.chapters th, table.chapters td { text-align: left; vertical-align: top; padding: 5px 8px;
       border-top: 1px solid #ddd; }
table.chapters th { background: #f0f0f0; }
.badge { display: inline-block; padding: 1px 6px; margin: 1px 2px; border-radius: 4px; font-size: 0.85em;
         white-space: nowrap; }
.holds { background: #d9f2d9; } .cond { background: #fff1c2; } .unsure { background: #e4e4f0; } .fails { background: #f8d4d4; }
.status-ok { color: #1a7f37; } .status-failed { color: #c33; font-weight: bold; }
.error { font-family: monospace; font-size: 0.85em; color: #a22; white-space: pre-wrap; }
.dirty { background: #fff1c2; font-size: 0.85em; padding: 0 4px; border-radius: 3px; }
a { color: #0b5cad; }
""" + _DIRTY_CSS
_BADGE = {"holds": "holds", "holds under conditions": "cond", "inconclusive": "unsure", "does not hold": "fails"}


def _title(nb_path: Path | None, data: Mapping[str, Any] | None, chapter: int) -> str:
    if data and data.get("title"):
        return str(data["title"])
    if nb_path is not None:
        return nb_path.stem.split("_", 1)[-1].replace("_", " ").capitalize()
    return f"Chapter {chapter}"


def _chapter_row(out: Path, c: int, rec: Mapping[str, Any] | None, nb_path: Path | None) -> str:
    nn = f"ch{c:02d}"
    data = load_chapter(out / f"{nn}.json") if (out / f"{nn}.json").exists() else None
    status = (rec or {}).get("status", "ok" if data else "not run")
    secs = (rec or {}).get("seconds")
    badges = "".join(
        f"<span class='badge {_BADGE[v.verdict]}' title='{html.escape(v.metric)}'>{v.id}: {v.verdict}</span>"
        for v in (data["verdicts"] if data else []) if v.role == "decision")  # one badge per claim
    links = [f"<a href='{n}'>{label}</a>" for n, label in
             ((f"{nn}.html", "report"), (f"{nn}.ipynb", "notebook"), (f"{nn}.json", "data"),
              (f"{nn}.failed.html", "failed run")) if (out / n).exists()]
    err = (rec or {}).get("error") if status == "failed" else None
    if err and data:
        err += "\n(the report and verdicts shown are from the last successful run)"
    dirty = " <span class='dirty'>dirty tree</span>" if (rec or {}).get("dirty_tree") else ""
    cells = [
        f"{c}",
        html.escape(_title(nb_path, data, c)),
        f"<span class='status-{html.escape(status.split()[0])}'>{html.escape(status)}</span>{dirty}",
        f"{secs:.0f} s" if isinstance(secs, int | float) else "",
        badges + (f"<div class='error'>{html.escape(err)}</div>" if err else ""),
        " · ".join(links),
    ]
    return "<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>"


def _provenance_line(out: Path) -> str:
    for f in sorted(out.glob("ch[0-9][0-9].json")):
        prov = json.loads(f.read_text(encoding="utf-8")).get("provenance") or {}
        if prov:
            gpu = f"; GPU {prov['gpu']}" if prov.get("gpu") else ""
            return (f"Measured on {html.escape(str(prov.get('cpu')))} ({prov.get('cpu_count')} cores{gpu}), "
                    f"commit <code>{html.escape(commit_label(prov))}</code>, "
                    f"torch {html.escape(str((prov.get('versions') or {}).get('torch')))}.")
    return ""


def write_index(out: Path, index: Mapping[str, Any], notebooks: Mapping[int, Path]) -> Path:
    """``<out>/index.html``: chapter 7's headline claims first, then one row per chapter, then every
    verdict of the study."""
    records = index.get("chapters", {})
    numbers = sorted({*notebooks, *(int(k) for k in records),
                      *(int(p.stem[2:]) for p in out.glob("ch[0-9][0-9].json"))})
    parts = [f"<h1>Fast LLM inference: a reproducible study</h1>"
             f"<p class='meta'>Profile <b>{html.escape(str(index.get('profile')))}</b>; index updated "
             f"{html.escape(str(index.get('updated')))}. {_provenance_line(out)}</p>"]
    dirty = [int(k) for k, rec in sorted(records.items(), key=lambda kv: int(kv[0])) if rec.get("dirty_tree")]
    if dirty:
        parts.append(f"<div class='studylib-dirty'><b>Dirty tree:</b> chapter{'s' * (len(dirty) > 1)} "
                     f"{', '.join(map(str, dirty))}. {html.escape(DIRTY_NOTE)}</div>")
    verdicts = load_verdicts(out)
    if verdicts:
        parts.append("<h2>The claims, one line each</h2><p>One decision per claim: a claim with parts that must "
                     "all hold (C6, C7) is decided by its weakest part on one configuration; a claim decided in "
                     "two chapters takes each chapter as a condition. The parts follow below.</p>"
                     + verdict_table(study_decisions(verdicts)).to_html())
    rows = "".join(_chapter_row(out, c, records.get(str(c)), notebooks.get(c)) for c in numbers)
    parts.append("<h2>Chapters</h2><table class='chapters'><tr><th>#</th><th>chapter</th><th>status</th>"
                 f"<th>time</th><th>verdicts</th><th>files</th></tr>{rows}</table>")
    if verdicts:
        parts.append("<h2>Every verdict, with its parts</h2>" + verdict_table(verdicts).to_html())
    parts.append("<p class='meta'>Verdicts are computed by rules in <code>studylib.claims</code> from the "
                 "measurements in each <code>chNN.json</code>; <code>studylib claims --profile "
                 f"{html.escape(str(index.get('profile')))}</code> prints the same table.</p>")
    return atomic_write(out / "index.html", _page("Fast LLM inference: study reports", "".join(parts), _INDEX_CSS))
