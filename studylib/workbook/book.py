"""The rendered study as a book: a front page, the chapters in order with navigation, search, one
printable page, all opening from the file system (no server).

Why nbconvert and the project's own page, not Jupyter Book 2 / MyST or Quarto: the book has to build
offline here, where only package registries are reachable. MyST's HTML build downloads its theme
from api.mystmd.org at build time (tried: "getaddrinfo ENOTFOUND"), and Quarto's PyPI package downloads
its binary from GitHub while it installs (no wheel, no Debian package); nbconvert
(already the renderer) turns papermill's executed notebooks into HTML, and headless Chromium prints
the same pages to PDF. papermill stays the executor: this module only reads what a run wrote
(``chNN.ipynb`` and ``chNN.json``) and can re-render without running anything (``studylib book``).

Every chapter page opens with its claims (Chinese and English) and a summary computed from the
chapter's verdicts: what was measured, the number with its CI and n, and the verdict. The import and
parameter cells are hidden (papermill still injects into them); the run's settings are one line on top
and in full in a collapsed appendix.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studylib.bench.provenance import commit_label
from studylib.claims import (
    AT_LEAST,
    AT_MOST,
    CLAIMS,
    CONDITIONAL,
    DECISION,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    Verdict,
    bar_with_origin,
    ci_level,
    format_bar,
    shown_condition,
)
from studylib.workbook.fonts import FONT_FAMILY, font_face_css
from studylib.workbook.page_check import NO_ALT  # nbconvert's placeholder for an image without a description
from studylib.workbook.paths import atomic_write
from studylib.workbook.tables import param_value

FONT_STACK = (f'-apple-system, "Segoe UI", Helvetica, Arial, "Noto Sans CJK SC", "PingFang SC", '
              f'"Microsoft YaHei", "{FONT_FAMILY}", sans-serif')
_BASE_CSS = """
body { font-family: FONTS; max-width: 1000px; margin: 1.5em auto; padding: 0 1em; color: #222; line-height: 1.5;
       overflow-wrap: break-word; }
a { color: #0b5cad; } h1 { font-size: 1.7em; line-height: 1.25; } h2 { margin-top: 1.6em; }
nav.book { display: flex; justify-content: space-between; gap: 1em; font-size: 0.9em; margin: 0.8em 0;
       padding: 0.4em 0; border-bottom: 1px solid #e1e4e8; }
nav.book.bottom { border-top: 1px solid #e1e4e8; border-bottom: none; margin-top: 2em; }
.zh { font-family: "Noto Sans CJK SC", "PingFang SC", "Microsoft YaHei", "FONT", sans-serif; }
.summary { border: 1px solid #c8d1dc; background: #f7f9fc; border-radius: 6px; padding: 0.6em 1em; margin: 1em 0; }
.summary h3 { margin: 0.2em 0 0.4em; font-size: 1.05em; }
.summary .claim-zh { color: #444; margin: 0.2em 0; } .summary .claim-en { font-style: italic; margin: 0.2em 0 0.5em; }
.summary dl { display: grid; grid-template-columns: max-content 1fr; gap: 0.15em 0.8em; margin: 0.3em 0; }
.summary dt { font-weight: bold; color: #555; } .summary dd { margin: 0; }
.summary ul { margin: 0.2em 0; padding-left: 1.2em; }
.same-kind { border-left: 3px solid #c8d1dc; padding: 0.1em 0.9em; margin: 0.6em 0; font-size: 0.92em; }
.same-kind h4 { margin: 0.3em 0; font-size: 1em; } .same-kind ul { margin: 0.2em 0 0.4em; padding-left: 1.2em; }
.instrument { border-left: 3px solid #d9c8a8; padding: 0.1em 0.9em; margin: 0.6em 0; font-size: 0.92em; }
.instrument h4 { margin: 0.3em 0; font-size: 1em; }
table.card td, table.card th { padding: 0.15em 0.5em; text-align: left; vertical-align: top; }
.settings { font-size: 0.85em; color: #555; margin: 0.3em 0 1em; }
/* A table fits its container: a cell may break anywhere, so a wide table wraps instead of running out of
   its box (tests/test_book_browser.py measures every table against its container). A cell that is one
   short word ("C1", "q4_1", "0.994", marked when the page is written) stays on one line, so a short column
   never shrinks to a letter a line; a table of many columns is set smaller so those still fit. */
th, td { overflow-wrap: anywhere; }
td[data-short], th[data-short] { overflow-wrap: normal; white-space: nowrap; }
table:has(tr > :nth-child(11)) { font-size: 0.8em; }
table:has(tr > :nth-child(16)) { font-size: 0.72em; }
@media (max-width: 800px) { table:has(tr > :nth-child(11)) { font-size: 0.64em; } }
table:has(tr > :nth-child(11)) :is(td, th) { padding-left: 3px !important; padding-right: 3px !important; }
.rendered-from { font-size: 0.8em; color: #666; margin-top: 2em; border-top: 1px solid #eee; padding-top: 0.4em; }
.badge { display: inline-block; padding: 1px 7px; border-radius: 4px; font-size: 0.9em; white-space: nowrap;
         font-weight: bold; }
.holds { background: #d9f2d9; } .cond { background: #fff1c2; } .unsure { background: #e4e4f0; }
.fails { background: #f8d4d4; }
details.appendix { margin-top: 2em; font-size: 0.85em; } details.appendix summary { cursor: pointer; font-weight: bold; }
table.kv { border-collapse: collapse; } table.kv th { text-align: left; padding-right: 1em; vertical-align: top; }
table.kv td { word-break: break-word; }
.studylib-dirty { background: #fff1c2; border: 1px solid #9a6700; padding: 0.6em 1em; margin: 1em 0; }
.studylib-error { background: #f8d4d4; border: 1px solid #c33; padding: 0.6em 1em; margin: 1em 0;
       font-family: monospace; white-space: pre-wrap; }
img { max-width: 100%; height: auto; }
figure.mechanism { margin: 1em 0; text-align: center; } figure.mechanism figcaption { font-size: 0.85em; color: #555; }
"""
_NOTEBOOK_CSS = """
.cell { margin: 0.7em 0; } .anchor-link { display: none; }
.input_area pre { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 4px; padding: 8px 10px;
       font-size: 0.85em; overflow-x: auto; margin: 0; }
.output_area pre { font-size: 0.82em; padding: 2px 10px; margin: 0.3em 0; white-space: pre-wrap; }
.output_stderr { display: none; }
.output_wrapper, .output_subarea, .rendered_html { max-width: 100%; overflow-x: auto; }
.rendered_html table { border-collapse: collapse; font-size: 0.85em; margin: 0.4em 0; }
.rendered_html th, .rendered_html td { padding: 3px 8px; border-bottom: 1px solid #ddd; text-align: left; }
.rendered_html thead th { background: #f0f0f0; }
blockquote { border-left: 3px solid #ccc; margin: 0.5em 0; padding: 0.1em 1em; color: #444; background: #fafafa; }
code { font-size: 0.9em; background: #f3f3f3; padding: 0 3px; border-radius: 3px; word-break: break-word; }
pre code { background: none; padding: 0; word-break: normal; }
.ansi-red-fg { color: #c33; } .ansi-green-fg { color: #1a7f37; } .ansi-blue-fg { color: #0b5cad; }
.ansi-bold { font-weight: bold; }
"""
_BADGE = {HOLDS: "holds", CONDITIONAL: "cond", INCONCLUSIVE: "unsure", FAILS: "fails"}
DIRTY_NOTE = ("Made from a git tree with uncommitted changes to tracked files: these results belong to no "
              "commit, not even the one named here.")
# Code cells a reader does not need to see: the imports, papermill's parameter cells.
_HIDDEN_TAGS = {"parameters", "injected-parameters", "hide-input"}
_IMPORT_LINE = re.compile(r"^(import\s|from\s+\S+\s+import\s)")


def css(extra: str = "") -> str:
    stack = FONT_STACK
    return (font_face_css() + _BASE_CSS.replace("FONTS", stack).replace('"FONT"', f'"{FONT_FAMILY}"') + PRINT_CSS
            + extra)


def rendered_note() -> str:
    """The commit this page was rendered from, which may be later than the commit that measured its numbers
    (named in its settings line): the book is re-rendered without rerunning a chapter."""
    from studylib.bench.provenance import git_state

    commit, dirty = git_state()
    return (f"<p class='rendered-from'>Page rendered from commit <code>{html.escape(commit_label({'git_commit': commit, 'git_dirty': dirty}))}"
            "</code>; its numbers were measured at the commit its settings name.</p>")


_RENDERED = re.compile(r"<p class='rendered-from'>.*?</p>", re.S)
# A table cell whose whole text is one short word ("C1", "q4_1", "0.994"): marked to stay on one line.
_SHORT_CELL = re.compile(r"""<(td|th)((?:\s(?:[^>"']|"[^"]*"|'[^']*')*)?)>(\s*[^<\s]{1,8}\s*)</\1>""")


def keep_short_cells(body: str) -> str:
    return _SHORT_CELL.sub(lambda m: m[0] if "data-short" in m[2] else f"<{m[1]}{m[2]} data-short>{m[3]}</{m[1]}>",
                           body)


def page(title: str, body: str, extra_css: str = "", script: str = "") -> str:
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
            f"<style>{css(extra_css)}</style></head><body>{keep_short_cells(_RENDERED.sub('', body))}"
            f"{rendered_note()}"
            + (f"<script>{script}</script>" if script else "") + "</body></html>")


def badge(verdict: str, label: str | None = None) -> str:
    return f"<span class='badge {_BADGE.get(verdict, 'unsure')}'>{html.escape(label or verdict)}</span>"


def zh(text: str) -> str:
    return f"<span class='zh' lang='zh-CN'>{html.escape(text)}</span>"


# ------------------------------------------------------------------------------------------ numbers

def sig(x: float, digits: int = 3) -> str:
    """Three significant figures, without scientific notation for the magnitudes the study prints."""
    if x != x:  # NaN
        return "not measured"
    if x == 0:
        return "0"
    text = f"{x:.{digits}g}"
    if "e" in text:
        text = f"{x:.{max(0, digits - 1 - int(f'{abs(x):e}'.split('e')[1]))}f}" if abs(x) >= 1e-4 else f"{x:.2e}"
    return text


def format_ci(measured: Any, ci: Sequence[float] | None, n: int | None, unit: str | None = None,
              confidence: float = 0.95) -> str:
    """``1.61 (95% CI 1.00 to 3.95, n=10 prompts)``; a corrected CI names its own level (98.33%); strings
    (a tally such as "2/4 hold") pass through."""
    if measured is None:
        return "not measured"
    if not isinstance(measured, int | float):
        return str(measured)
    m = float(measured)
    digits = 3
    if ci is not None:  # more digits only where three would print a bound equal to a value it is not
        def blurred(d: int) -> bool:
            return any(sig(m, d) == sig(b, d) and m != b for b in ci)

        while digits < 6 and blurred(digits):
            digits += 1
    text = sig(m, digits)
    inner = []
    if ci is not None:
        inner.append(f"{ci_level(confidence)} CI {sig(ci[0], digits)} to {sig(ci[1], digits)}")
    if n is not None:
        inner.append(f"n={n}{' ' + unit if unit else ''}")
    return text + (f" ({', '.join(inner)})" if inner else "")


# ------------------------------------------------------------------------------------------ summaries

def _parts_of(verdicts: Sequence[Verdict], decision: Verdict) -> list[Verdict]:
    return [v for v in verdicts if v.id == decision.id and v.role != DECISION and v.chapter == decision.chapter]


_STRENGTH = {FAILS: 0, INCONCLUSIVE: 1, CONDITIONAL: 2, HOLDS: 3}


def weakest_first(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """Verdict rows ordered from "does not hold" to "holds"; within a verdict, the row whose CI ends
    furthest below its bar (as a multiple of the bar) first, rows without a bar last (stable among those)."""
    def key(v: Verdict) -> tuple[int, float]:
        r = bar_ratio(v)
        return _STRENGTH.get(v.verdict, 1), (r[1] if r else float("inf"))

    return sorted(verdicts, key=key)


def verdict_number(v: Verdict) -> str:
    """A verdict row's number as the pages print it: value (its CI at its level, n with its unit)."""
    return format_ci(v.measured, v.ci, v.n, v.unit, v.confidence)


def metric_where(v: Verdict) -> str:
    """A row's metric with the condition its number is from, when it was judged over several."""
    where = shown_condition(v)
    return f"{v.metric} ({where})" if where else v.metric


def bar_ratio(v: Verdict) -> tuple[float, float, float] | None:
    """The measurement as a multiple of its bar (>= 1 clears it), with its CI, for the figure."""
    if not isinstance(v.measured, int | float) or v.ci is None or not v.threshold:
        return None
    m, lo, hi, t = float(v.measured), float(v.ci[0]), float(v.ci[1]), float(v.threshold)
    if v.direction == AT_LEAST and t > 0 and m > 0 and lo > 0:
        return m / t, lo / t, hi / t
    if v.direction == AT_MOST and m > 0 and lo > 0 and hi > 0:
        return t / m, t / hi, t / lo
    return None


def claim_summary(decision: Verdict, parts: Sequence[Verdict]) -> str:
    """The three lines under a claim: what was measured, the number (CI, n), the verdict."""
    claim = CLAIMS.get(decision.id)
    head = f"<h3>{html.escape(decision.id)}</h3>"
    if claim:
        head += (f"<p class='claim-zh'>原文：“{zh(claim.quote_zh)}”</p>"
                 f"<p class='claim-en'>{html.escape(claim.text)}</p>")
    numeric = isinstance(decision.measured, int | float) and not isinstance(decision.measured, bool)
    if numeric:
        number = html.escape(verdict_number(decision))
        bar = "" if format_bar(decision) == "all checks" else f" against the bar {html.escape(bar_with_origin(decision))}"
        number += bar
    else:
        items = []
        parts = weakest_first(parts)  # a skimmer reads the failure first
        for p in parts[:6]:
            items.append(f"<li>{html.escape(metric_where(p))}: {html.escape(verdict_number(p))} {badge(p.verdict)}</li>")
        more = f"<li>and {len(parts) - 6} more rows in the verdict table below</li>" if len(parts) > 6 else ""
        number = html.escape(str(decision.measured if decision.measured is not None else "")) + \
            (f"<ul>{''.join(items)}{more}</ul>" if items else "")
    cond = f"<dd>{html.escape(decision.conditions)}</dd>" if decision.conditions else ""
    return (head + "<dl>"
            f"<dt>Measured</dt><dd>{html.escape(decision.metric)}</dd>"
            f"<dt>Result</dt><dd>{number}</dd>"
            f"<dt>Verdict</dt><dd>{badge(decision.verdict)}</dd>"
            + (f"<dt>Conditions</dt>{cond}" if cond else "") + "</dl>")


def runs_line(data: Mapping[str, Any]) -> str:
    """Where the page's machine-level numbers come from (how many whole runs, fresh processes) and what the
    run ledger holds of this chapter's code on this CPU, in one paragraph ("" when there is neither)."""
    from studylib import ledger

    whole = (data.get("measurements") or {}).get("whole_runs")
    n = len(whole.get("runs") or []) if isinstance(whole, Mapping) else 0
    parts = []
    if n:
        parts.append(f"Every speed-up and machine-level number that decides a verdict on this page is taken over {n} "
                     "whole runs: fresh processes that reload the model and measure the bandwidth again; the CIs "
                     "over prompts inside one run are shown beside them, never in their place.")
    record = {**data, "verdicts": [v.to_dict() if hasattr(v, "to_dict") else v for v in data.get("verdicts") or []]}
    seen = ledger.summary(record)
    if seen:
        parts.append(seen)
    return f"<p class='runs-line'>{html.escape(' '.join(parts))}</p>" if parts else ""


def chapter_summary(data: Mapping[str, Any]) -> str:
    verdicts = list(data.get("verdicts") or [])
    decisions = [v for v in verdicts if v.role == DECISION]
    if not decisions:
        return ""
    return ("<div class='summary'>" + "".join(claim_summary(d, _parts_of(verdicts, d)) for d in decisions)
            + runs_line(data) + "</div>")


def arithmetic_words(params: Mapping[str, Any]) -> str:
    """What the run's linears compute in: the dtype for dense weights, else the stored blocks and the
    activations' arithmetic (a chapter on the GGUF engine with int8 activations is not 'float32')."""
    weights = params.get("weights")
    if weights and weights != "dense":
        return f"{weights} weights, {params.get('act') or 'fp32'} activations"
    return str(params.get("dtype", ""))


def _kernel_words(params: Mapping[str, Any], prov: Mapping[str, Any]) -> str:
    """The dot-product path a run's int8 or bf16 activations took ("; int8 dot products on amx"): the
    ISA label names the best bf16 unit, not the integer one a GGUF int8 chapter used."""
    act = params.get("act")
    kernel = prov.get(f"{act}_kernel") if act in ("int8", "bf16") else None
    return f"; {act} dot products on {kernel}" if kernel else ""


def settings_line(data: Mapping[str, Any]) -> str:
    prov = data.get("provenance") or {}
    params = data.get("params") or {}
    isa = (prov.get("isa") or {}).get("label") if isinstance(prov.get("isa"), Mapping) else prov.get("isa")
    bits = [str(params.get("model") or prov.get("model") or ""),
            " on ".join(b for b in (arithmetic_words(params), str(params.get("device") or "")) if b),
            f"{prov.get('torch_threads') or params.get('threads')} threads",
            f"profile {params.get('profile')}" if params.get("profile") else "",
            f"{prov.get('cpu')}" + (f" (ISA {isa}{_kernel_words(params, prov)})" if isa else "") if prov.get("cpu") else "",
            f"GPU {prov['gpu']}" if prov.get("gpu") else "",
            f"measured at commit {commit_label(prov)}" if prov.get("git_commit") else "",
            str(prov.get("date", ""))[:10]]
    return "<p class='settings'>Run: " + html.escape(" · ".join(b for b in bits if b and b != "None threads")) + \
        ". Full settings in the appendix at the end.</p>"


def appendix(data: Mapping[str, Any]) -> str:
    from studylib.workbook.chapter import provenance_rows

    params = data.get("params") or {}
    prov = dict(data.get("provenance") or {})
    prov.pop("params", None)
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td><code>{html.escape(param_value(v))}"
                   f"</code></td></tr>" for k, v in params.items())
    prow = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in provenance_rows(prov, "saved"))
    return ("<details class='appendix'><summary>Appendix: every parameter of this run and its provenance</summary>"
            f"<h4>Parameters</h4><table class='kv'>{rows}</table><h4>Provenance</h4><table class='kv'>{prow}</table>"
            "</details>")


# ------------------------------------------------------------------------------------------ chapters

def mechanism_html(chapter: int, params: Mapping[str, Any]) -> str:
    """The chapter's mechanism picture(s) (``studylib.diagrams``), inlined as PNG under its summary."""
    import base64
    import io

    from studylib.diagrams import _plt, mechanism_figures

    caption, figs = mechanism_figures(chapter, params)
    if not figs:
        return ""
    plt = _plt()
    imgs = []
    for fig in figs:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        data = base64.b64encode(buf.getvalue()).decode("ascii")
        imgs.append(f"<img src='data:image/png;base64,{data}' alt='{html.escape(caption)}'>")
    return (f"<figure class='mechanism'>{''.join(imgs)}<figcaption>{html.escape(caption)} (a diagram drawn by "
            "the study's own code with this run's sizes; the measurements follow)</figcaption></figure>")


def is_setup_cell(cell: Any) -> bool:
    """A code cell that only imports (or only sets papermill parameters): hidden in the page."""
    if cell.get("cell_type") != "code":
        return False
    tags = set((cell.get("metadata") or {}).get("tags") or [])
    if tags & _HIDDEN_TAGS:
        return True
    lines = [ln for ln in str(cell.get("source", "")).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    imports, open_paren = 0, False
    for ln in lines:
        if open_paren:  # a line of a parenthesised "from x import (a, b," statement
            imports += 1
            open_paren = ")" not in ln
        elif _IMPORT_LINE.match(ln):
            imports += 1
            open_paren = "(" in ln and ")" not in ln
    return bool(lines) and imports >= 0.6 * len(lines)  # mostly imports (plus a plots.setup() or two)


_CHAPTER_REF = re.compile(r"(?<![\[\w/])\b([Cc]hapter (\d+))\b(?!\]|\()")
_CODE_SPAN = re.compile(r"(`[^`]*`)")


def cross_reference(markdown: str, current: int, chapters: Sequence[int]) -> str:
    """Link "chapter N" in prose to that chapter's page (not in headings, code or existing links)."""
    out = []
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith("#"):
            out.append(line)
            continue
        parts = _CODE_SPAN.split(line)
        for i in range(0, len(parts), 2):  # even parts are outside code spans
            parts[i] = _CHAPTER_REF.sub(
                lambda m: (f"[{m.group(1)}](ch{int(m.group(2)):02d}.html)"
                           if int(m.group(2)) in chapters and int(m.group(2)) != current else m.group(1)), parts[i])
        out.append("".join(parts))
    return "".join(out)


def _notebook_body(nb: Any, chapter: int = 0, links: Sequence[int] = ()) -> str:
    """The notebook as HTML without its setup cells; its "Try this" section is taken from
    ``studylib.workbook.exercises`` (the tested commands), whatever the executed notebook held."""
    import copy

    from nbconvert import HTMLExporter
    from traitlets.config import Config

    from studylib.workbook.exercises import exercises_markdown

    nb = copy.deepcopy(nb)
    exercises = exercises_markdown(chapter)
    for cell in nb.cells:
        remove = is_setup_cell(cell)
        if cell.cell_type == "markdown" and cell.source.startswith("## Try this") and exercises:
            cell.source = exercises
        elif cell.cell_type == "markdown" and links:
            cell.source = cross_reference(cell.source, chapter, links)
        if cell.cell_type == "code" and ("show_exercises(" in cell.source or "show_mechanism(" in cell.source):
            remove = True
        if remove:
            tags = list(cell.metadata.get("tags", []))
            cell.metadata["tags"] = [*tags, "studylib-remove"]
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            _readable_output(out)
    c = Config()
    c.TagRemovePreprocessor.remove_cell_tags = ("studylib-remove",)
    c.TagRemovePreprocessor.enabled = True
    exporter = HTMLExporter(template_name="basic", config=c)
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    # The pages are for reading: a code cell's source is one call into the library (the notebook is where
    # to read it), so the page shows what it printed and drew, not the call.
    exporter.exclude_input = True
    body, _ = exporter.from_notebook_node(nb)
    return _alt_texts(body, figure_captions(nb, notebook_title(nb, f"Chapter {chapter}")))


def _plain(text: str, limit: int) -> str:
    """Markdown to plain words (links to their text, no emphasis or code marks), cut at a word to ``limit``."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", text).strip()
    return text if len(text) <= limit else text[: limit - 1].rsplit(" ", 1)[0] + "…"


def _first_sentence(text: str, limit: int = 220) -> str:
    return _plain(re.split(r"(?<=[a-z)][.!?])\s", _plain(text, 10_000), maxsplit=1)[0], limit)


def figure_captions(nb: Any, title: str) -> list[str]:
    """A description for each image the page shows, in page order: the section it sits in and the first
    sentence of the prose just before it (the text that introduces the figure)."""
    section, lead, out = title, "", []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines = [ln.strip() for ln in cell.source.splitlines() if ln.strip()]
            heads = [ln.lstrip("#").strip() for ln in lines if ln.startswith("#")]
            prose = [ln for ln in lines if not ln.startswith("#")]
            if heads:
                section = _plain(heads[-1], 120)
                lead = ""
            if prose:
                lead = _first_sentence(" ".join(prose))
        elif cell.cell_type == "code" and "studylib-remove" not in cell.metadata.get("tags", []):
            for output in cell.get("outputs", []):
                if "image/png" in (output.get("data") or {}):
                    out.append(f"Figure in “{section}”" + (f": {lead}" if lead else ""))
    return out


def _alt_texts(body: str, captions: Sequence[str]) -> str:
    """Put ``captions`` in place of nbconvert's placeholder, image by image in page order."""
    for caption in captions:
        if NO_ALT not in body:
            break
        body = body.replace(f'alt="{NO_ALT}"', f'alt="{html.escape(caption, quote=True)}"', 1)
    return body


_PIVOT_ARMS = {"dense per op": "dense (per-op path)", "dense perop": "dense (per-op path)"}


def _pivot_header(quantity: str, arm: str) -> str:
    """"Tokens s" + "dense per op" -> "Tokens/s, dense (per-op path)"; "Speedup" + "q8 0" -> "Speedup, q8_0"."""
    from studylib.workbook.tables import WHOLE_NAMES

    q, a = quantity.strip(), arm.strip()
    a = re.sub(r"\b(i?q[1-8]) ([0-9a-z]{1,3})\b", r"\1_\2", a)
    # the header as it ran ("Tokens s") is tables.header's input with its underscores made spaces
    return f"{WHOLE_NAMES.get(q.lower().replace(' ', '_'), q)}, {_PIVOT_ARMS.get(a, a)}"


def _readable_output(out: Any) -> None:
    """Put a raw pandas table that a notebook displayed (before the formatting layer existed, or from a
    frame it printed directly) through ``studylib.workbook.tables``; anything else stays as it is."""
    from studylib.workbook.tables import frame_from_html, to_html, words

    data = out.get("data") or {}
    markup = data.get("text/html")
    if not markup:
        return
    markup = "".join(markup) if isinstance(markup, list) else markup
    if "studylib-table" in markup:
        # formatted when the chapter ran; a cell that is one identifier ("few_shot", from a run before the
        # formatting layer gave identifiers words) gets its words now, every other cell stays as it ran
        markup = re.sub(r"(<td[^>]*>)\s*([a-z][a-z0-9_]*)\s*(</td>)",
                        lambda m: m.group(1) + html.escape(words(m.group(2))) + m.group(3), markup)
        # a pivoted column ("tokens_s:dense_perop") that ran before the formatting layer knew pivots reads
        # "Tokens s:dense per op"; give it the words tables.header gives it now
        data["text/html"] = re.sub(r"(<th[^>]*>)([^<:]+):([^<]+)(</th>)",
                                   lambda m: m.group(1) + _pivot_header(m.group(2), m.group(3)) + m.group(4), markup)
        return
    if 'class="dataframe' not in markup:
        return
    df = frame_from_html(markup)
    if df is not None:
        data["text/html"] = to_html(df)


def notebook_title(nb: Any, default: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return default


def _split_title(body: str) -> tuple[str, str]:
    """Cut the rendered body after its first <h1> so the summary sits right under the title."""
    m = re.search(r"</h1>", body)
    if not m:
        return "", body
    return body[: m.end()], body[m.end():]


def nav(chapters: Sequence[tuple[int, str]], current: int | None, where: str = "top") -> str:
    nums = [c for c, _ in chapters]
    titles = dict(chapters)
    prev_link = next_link = "<span></span>"
    if current in nums:
        i = nums.index(current)
        if i > 0:
            p = nums[i - 1]
            prev_link = f"<a href='ch{p:02d}.html'>&larr; {html.escape(titles[p])}</a>"
        if i + 1 < len(nums):
            n = nums[i + 1]
            next_link = f"<a href='ch{n:02d}.html'>{html.escape(titles[n])} &rarr;</a>"
    return (f"<nav class='book {where}'>{prev_link}<a href='index.html'>Contents and verdicts</a>"
            f"{next_link}</nav>")


def render_chapter(nb: Any, data: Mapping[str, Any] | None, chapters: Sequence[tuple[int, str]], chapter: int,
                   dirty: bool = False, error: str | None = None, title: str | None = None,
                   same_kind: str = "", classroom: str = "") -> str:
    """One chapter page: navigation, title, claims with their computed summary, the same kind of number in
    other chapters (``same_kind``, HTML from ``studylib.workbook.same_kind.block``), settings line, the
    executed notebook without its setup cells, the takeaways and questions (``classroom``), the appendix,
    navigation."""
    from pygments.formatters import HtmlFormatter

    default = title or f"Chapter {chapter}"
    title = notebook_title(nb, default) if nb is not None else default
    banner = ""
    if dirty:
        banner += f"<div class='studylib-dirty'><b>Dirty tree.</b> {html.escape(DIRTY_NOTE)}</div>"
    if error:
        banner += (f"<div class='studylib-error'><b>This chapter failed; the outputs below are partial.</b>\n"
                   f"{html.escape(error)}</div>")
    linked = [c for c, _ in chapters]
    head, rest = _split_title(_notebook_body(nb, chapter, linked)) if nb is not None else ("", "")
    top = (chapter_summary(data) + same_kind + settings_line(data)) if data else ""
    top += mechanism_html(chapter, (data or {}).get("params") or {})
    body = (nav(chapters, chapter) + banner + head + top + rest + classroom + (appendix(data) if data else "")
            + nav(chapters, chapter, "bottom"))
    extra = _NOTEBOOK_CSS + HtmlFormatter(style="default").get_style_defs(".highlight")
    return page(title, body, extra)


# ------------------------------------------------------------------------------------------ the book

def executed_notebooks(out: Path) -> dict[int, Any]:
    """Every executed chapter notebook in ``out`` (``chNN.ipynb``), read once, by chapter number."""
    import nbformat

    return {int(p.stem[2:]): nbformat.read(str(p), as_version=4) for p in sorted(out.glob("ch[0-9][0-9].ipynb"))}


def chapter_list(out: Path, executed: Mapping[int, Any] | None = None) -> list[tuple[int, str]]:
    """(number, title) of every chapter with an executed notebook in ``out`` (or in ``executed``)."""
    executed = executed_notebooks(out) if executed is None else executed
    return [(c, notebook_title(nb, f"Chapter {c}")) for c, nb in sorted(executed.items())]


_DIV_TAG = re.compile(r"<div\b[^>]*>|</div>")


def _blocks(body: str, opening: re.Pattern) -> list[tuple[int, int]]:
    """(start, end) of every ``<div>`` whose opening tag matches ``opening``, nested divs balanced."""
    spans = []
    for m in opening.finditer(body):
        depth, end = 0, None
        for t in _DIV_TAG.finditer(body, m.start()):
            depth += -1 if t.group().startswith("</") else 1
            if depth == 0:
                end = t.end()
                break
        if end is not None and not (spans and m.start() < spans[-1][1]):
            spans.append((m.start(), end))
    return spans


# The printed edition a class carries: each chapter's text, figures, verdicts and classroom notes. The
# blocks the front matter already prints once (the instrument card, the same kind of number across
# chapters, provenance) and the chapters' data tables (on the HTML pages, one link away) are left out,
# so the whole study prints in well under 60 pages.
_PRINT_DROPPED = re.compile(r"<div class=['\"](?:same-kind|instrument)['\"][^>]*>")
_OUTPUT_AREA = re.compile(r"<div class=['\"]output_area['\"][^>]*>")
_VERDICT_TABLE = re.compile(r"<table class=\"verdict-table\".*?</table>", re.S)
_PRINT_HIDDEN_COLUMNS = ("claimed", "conditions")


def _without_columns(table: str, names: Sequence[str]) -> str:
    """A pandas-Styler table without the columns headed by ``names`` (its cells carry ``colN`` classes)."""
    heads = re.findall(r"<th class=\"col_heading level0 (col\d+)\"[^>]*>([^<]*)</th>", table)
    for col, name in heads:
        if name.strip() in names:
            table = re.sub(rf"<t([hd]) class=\"[^\"]*\b{col}\b[^\"]*\"[^>]*>.*?</t\1>", "", table, flags=re.S)
    return table


def print_edition(body: str, chapter: int) -> str:
    """A chapter page's body as the printed book carries it (see ``_PRINT_DROPPED``): the verdict table
    stays, without the claim's words and each row's conditions (the chapter's summary box prints the
    decision's conditions, the HTML page every row's); every other data table becomes one line pointing
    at the chapter's HTML page."""
    body = _VERDICT_TABLE.sub(lambda m: _without_columns(m.group(), _PRINT_HIDDEN_COLUMNS), body)
    for s, e in reversed(_blocks(body, _PRINT_DROPPED)):
        body = body[:s] + body[e:]
    note = (f"<p class='print-note'>(A table of measurements: in the HTML edition, <i>ch{chapter:02d}.html</i>.)"
            "</p>")
    for s, e in reversed(_blocks(body, _OUTPUT_AREA)):
        block = body[s:e]
        if "<table" not in block or "verdict-table" in block or "<img" in block:
            continue
        body = body[:s] + (note if "class=\"provenance\"" not in block else "") + body[e:]
    # tables one after another leave one note, not a column of them
    return re.sub(rf"(?:{re.escape(note)}\s*(?:</div>\s*)*(?:<div[^>]*>\s*)*){{2,}}", lambda m: note + m.group()[len(note):]
                  .replace(note, ""), body)


def write_print_page(out: Path, chapters: Sequence[tuple[int, str]]) -> Path:
    """``book.html``: every chapter on one page, for printing (``studylib book --pdf`` prints it)."""
    parts = []
    for c, _ in chapters:
        text = (out / f"ch{c:02d}.html").read_text(encoding="utf-8")
        body = text.split("<body>", 1)[-1].rsplit("</body>", 1)[0]
        body = re.sub(r"<nav class='book[^']*'>.*?</nav>", "", body, flags=re.S)
        parts.append(f"<section class='chapter' id='ch{c:02d}'>{print_edition(body, c)}</section>")
    style = ("section.chapter { break-before: page; } details.appendix { display: none; } "
             "@page { size: A4; margin: 10mm 12mm; } "
             # the front matter's every-verdict table prints in its compact form (no conditions column)
             "section.front details.all { display: none; } section.front .print-only { display: block; } "
             "@media print { body { font-size: 8.6pt; line-height: 1.24; } "
             "img { max-width: 46% !important; display: block; margin: 0.3em auto; break-inside: avoid; } "
             "section.front img { max-width: 100% !important; } "
             "h1 { font-size: 17pt; } h2 { font-size: 13pt; } h3 { font-size: 11pt; } "
             "p.print-note { color: #555; font-size: 8pt; margin: 0.2em 0; } "
             # the book's tables are few and fit whole: their cells wrap between words only, so no word or
             # number breaks (a chapter page printed alone may still wrap inside a long word to fit)
             "section th, section td { overflow-wrap: normal !important; } } "
             # the front matter's wide tables (the card, every verdict) scroll on a screen as on the front page
             ".table-wrap { max-width: 100%; overflow-x: auto; } pre.cmd { white-space: pre-wrap; overflow-wrap: anywhere; } "
             # a command block (the exercises') wraps on paper rather than running off the page's right edge
             "section pre { white-space: pre-wrap; overflow-wrap: anywhere; } "
             # the card prints once, whole, in the front matter: a chapter's own copy of its lines is left out
             "section.chapter div.instrument { display: none; } "
             ".input_area pre { white-space: pre-wrap; } section.front h2 { break-after: avoid; } ")
    toc = "".join(f"<li><a href='#ch{c:02d}'>{html.escape(t)}</a></li>" for c, t in chapters)
    from pygments.formatters import HtmlFormatter

    return atomic_write(out / "book.html", page(
        "Fast LLM inference: the whole study", front_matter(out) + f"<section class='contents'><h2>Contents</h2>"
        f"<ol>{toc}</ol></section>" + "".join(parts),
        _NOTEBOOK_CSS + style + HtmlFormatter(style="default").get_style_defs(".highlight")))


# Printed, a table cannot scroll: it wraps its cells and shrinks its type to fit the page width instead
# of losing its right-hand columns (and no scroll bar is printed). Part of every page's style, so a chapter
# printed from the browser fits too, not only book.pdf.
PRINT_CSS = """
@media print {
  .table-wrap, .output_html, .output_subarea, .output_area, div.jp-RenderedHTMLCommon {
    overflow: visible !important; max-width: 100% !important; }
  table { font-size: 7pt !important; max-width: 100% !important; table-layout: auto; }
  th, td { overflow-wrap: anywhere; word-break: normal; padding: 1px 3px !important; }
  table:has(tr > :nth-child(16)) { font-size: 6pt !important; }
  ::-webkit-scrollbar { display: none; }
}
"""


# Front-page sections that serve a browser only: the chapter links (the book has its contents list) and the
# search box (paper cannot be searched); both are dropped from the printed front matter.
_SCREEN_ONLY = ("The chapters", "Search the chapters")


def front_matter(out: Path) -> str:
    """The front page for the top of the printed book: a reader of the PDF meets the verdicts on page 1,
    then everything the front page holds for a reader (the essay, what was run, the claims figure, the
    sweeps, the instrument card, how numbers differ across chapters, how to rerun it, and every verdict
    with its parts, unfolded), without the parts that only work on a screen."""
    index = out / "index.html"
    if not index.exists():
        return "<h1>Fast LLM inference: a reproducible study</h1>"
    body = index.read_text(encoding="utf-8").split("<body>", 1)[-1].rsplit("</body>", 1)[0]
    body = re.sub(r"<script.*?</script>", "", body, flags=re.S)
    for title in _SCREEN_ONLY:
        body = re.sub(rf"<h2[^>]*>{re.escape(title)}</h2>.*?(?=<h2|<details class='all'|$)", "", body, flags=re.S)
    body = body.replace("<details class='all'>", "<details class='all' open>")
    return "<section class='front'>" + body + "</section>"


def print_pdf(out: Path, chromium: str | None = None) -> Path:
    """Print ``book.html`` to ``book.pdf`` with headless Chromium (Debian's ``chromium``)."""
    import shutil
    import subprocess

    from studylib.errors import StudylibError

    exe = chromium or shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not exe:
        raise StudylibError("no Chromium to print with; install Debian's chromium (apt-get install chromium) or "
                            "pass --chromium PATH.")
    pdf = out / "book.pdf"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
                    f"--print-to-pdf={pdf}", (out / "book.html").resolve().as_uri()],
                   check=True, capture_output=True, timeout=600)
    return pdf
