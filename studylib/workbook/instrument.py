"""The instrument card: the machine-level numbers of one reproduce run, gathered on one card.

Every chapter times its techniques on the same instrument, a 2-core CPU reading weights from memory, and
the chapters' verdicts rest on a handful of machine-level numbers: the read bandwidth, the time of a
one-row decode step, v(k) (what a step of k rows costs in one-row steps) and c (what a draft forward
costs in target steps). Each chapter measures the ones it needs, under its own conditions (engine,
arithmetic, context), so the same kind of number appears several times with different values. The card
puts them side by side, each with the chapter that measured it, its conditions and how it was measured
(whole runs in fresh processes, or repeats inside one process), so a reader sees that 2.55 and 4.61 are
v(16) of two engines at two contexts rather than two answers to one question.

The card reads the chapters' saved results (``chNN.json``) and computes nothing new: it is a view, and
never feeds a verdict. ``card`` returns it as data (written beside the pages as ``instrument.json``),
``block`` as HTML: the whole card on the front page, and on each chapter page the lines that chapter
measured plus the bandwidth its own whole runs saw.
"""

from __future__ import annotations

import html
import json
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from studylib.workbook.same_kind import _chapter_data as _chapter
from studylib.workbook.same_kind import _finite
from studylib.workbook.tables import BLOCK_FORMAT

CHAPTERS = range(1, 9)
KINDS = ("bandwidth", "step", "v", "c")
KIND_TITLES = {
    "bandwidth": "Read bandwidth (GB/s), measured at the start of each whole run",
    "step": "One-row decode step (ms)",
    "v": "v(k): a step of k rows, in one-row steps",
    "c": "c: one draft forward, in target steps",
}


def _line(kind: str, chapter: int, what: str, value: float, low: float | None = None, high: float | None = None,
          n: int | None = None, how: str = "", cond: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """One number of the card. ``cond``: what it is a number of, as fields the comparison reads (IDENTITY:
    which engine and which drafter; CONDITION: the context, the KV cache, what the rows are, what a cost is
    counted in)."""
    ci = [float(low), float(high)] if _finite(low, high) else None
    return {"kind": kind, "chapter": chapter, "what": what, "value": float(value), "ci": ci,
            "n": None if n is None else int(n), "how": how, "cond": dict(cond or {}), **extra}


def _engine(params: Mapping[str, Any]) -> str:
    weights, act = params.get("weights"), params.get("act")
    if weights and weights != "dense":
        return f"{weights} weights, {act or 'fp32'} arithmetic"
    return f"dense {params.get('dtype', 'float32')}"


_WEIGHTS = {"dense", "gguf", "awq4"}  # and every block format (page_check.BLOCK_FORMAT: q4_1, q8_0, ...)
_ACTS = {"fp32", "int8", "bf16"}


def _engine_named(name: str) -> str:
    """An engine as chapters 1 and 8 name it ("gguf int8", "gguf", "dense", "q4_1@bf16") in ``_engine``'s
    words, so that one engine reads the same on every line. Any other word is kept as a qualifier ("dense
    per-op" is not "dense"), and a name that is no weight format (an arm such as "kv_int8") stays itself."""
    weights, _, rest = str(name).replace("@", " ").partition(" ")
    words = rest.split()
    if weights not in _WEIGHTS and not BLOCK_FORMAT.match(weights):
        return str(name)
    act = next((w for w in words if w in _ACTS), None)
    extra = " ".join(w for w in words if w != act)
    base = _engine({"weights": weights, "act": act})
    return f"{base} ({extra})" if extra else base


def _executed_params(notebook: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters a chapter ran with, from its executed notebook: the defaults cell overridden by
    papermill's injected cell (a default the profile does not set, such as chapter 1's ``rows_context``, is
    recorded nowhere else). Literal assignments only; anything else is left out."""
    import ast

    from studylib.workbook.paths import parameter_cells

    found: dict[str, Any] = {}
    for source in parameter_cells(notebook):
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    found[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return found


def _read_notebook(out: Path, chapter: int) -> dict[str, Any]:
    try:
        return json.loads((Path(out) / f"ch{chapter:02d}.ipynb").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


# The fields a line's ``cond`` may carry. Two lines are one quantity when kind, k and IDENTITY agree; they
# are then the same measurement when CONDITION agrees too, and must agree in value unless a reason is given.
IDENTITY = ("engine", "draft")
CONDITION = ("context", "kv", "mask", "rows", "per")
CONDITION_WORDS = {"context": "context", "kv": "KV cache", "mask": "attention", "rows": "rows", "per": "unit"}
_FORWARD = "one forward of the model"  # a step timed as a bare forward (no sampling, no scheduler)
_CAUSAL = "causal, no explicit mask (the plain path)"


# ------------------------------------------------------------------------------------------ readers


def _bandwidth(chapter: int, data: Mapping[str, Any]) -> list[dict]:
    runs = ((data.get("measurements") or {}).get("whole_runs") or {}).get("runs") or []
    out = []
    for i, r in enumerate(runs, 1):
        if _finite(r.get("bandwidth_gbs")):
            load = (r.get("load_before") or [float("nan")])[0]
            out.append(_line("bandwidth", chapter, f"whole run {i}", r["bandwidth_gbs"], n=1,
                             how=f"fresh process, started {r.get('started', '?')}, 1-min load {load:.2f}",
                             started=r.get("started"), load=load, run=i))
    return out


def _steps_and_v(chapter: int, data: Mapping[str, Any]) -> list[dict]:
    m, p = data.get("measurements") or {}, data.get("params") or {}
    out: list[dict] = []
    if chapter == 1:
        reps = p.get("rows_repeats")
        for r in m.get("step_vs_rows") or []:
            # the rows sweep runs at its own context (rows_context), not the batch sweep's (context)
            ctx = r.get("context", p.get("rows_context"))
            where = f"{r.get('engine')} ({r.get('kernel') or r.get('path')}), context {ctx or 'not recorded'}"
            how = f"median of {r.get('n') or reps} interleaved repeats in one process"
            cond = {"engine": _engine_named(r.get("engine") or "dense"), "context": ctx, "kv": "dense",
                    "mask": _CAUSAL, "rows": "k rows of one sequence", "per": _FORWARD}
            if r.get("rows") == 1 and _finite(r.get("ms")):
                out.append(_line("step", 1, where, r["ms"], r.get("ms_low"), r.get("ms_high"), r.get("n"), how,
                                 cond))
            elif _finite(r.get("v")):
                out.append(_line("v", 1, where, r["v"], r.get("v_low"), r.get("v_high"), r.get("n"), how, cond,
                                 k=int(r["rows"])))
    elif chapter == 2:
        # the EAGLE heads also ran on a second engine: the GGUF's weights with fp32 activations
        second = "gguf weights, fp32 arithmetic"
        for r in m.get("eagle_gguf_costs") or []:
            if _finite(r.get("ar_ms_per_token")):
                out.append(_line("step", 2, f"AR on {second}, chat prompts", r["ar_ms_per_token"],
                                 how="AR's time per token over the prompts, one process",
                                 cond={"engine": second, "context": "the chat prompts' own", "kv": "dense",
                                       "mask": _CAUSAL, "per": "a step of the AR decode loop (sampling included, prefill not)"}))
                break
        for r in m.get("eagle_trees") or []:
            if _finite(r.get("v")) and r.get("verify_tokens"):
                out.append(_line("v", 2, f"{r['method']} verification on {_engine(p)}", r["v"],
                                 how="one process, over the chapter's prompts", k=int(r["verify_tokens"]),
                                 cond={"engine": _engine(p), "draft": r["method"], "context": "the prompts' own",
                                       "kv": "dense", "mask": "the draft tree's mask", "rows": "a draft tree's rows",
                                       "per": "a verify step of the decoder"}))
        for r in m.get("eagle_gguf_costs") or []:
            if _finite(r.get("v")):
                out.append(_line("v", 2, f"{r['method']} verification on {second}", r["v"],
                                 how="one process, over the chapter's chat prompts",
                                 cond={"engine": second, "draft": r["method"], "context": "the chat prompts' own",
                                       "kv": "dense", "mask": "the draft tree's mask", "rows": "a draft tree's rows",
                                       "per": "a verify step of the decoder"}))
    elif chapter == 3:
        rows = [r for r in m.get("step_time_curve") or [] if _finite(r.get("seconds"))]
        base = next((r for r in rows if r.get("T") == 1), None)
        where = f"{_engine(p)}, context {p.get('curve_context')}"
        how = f"median of {p.get('curve_repeats')} repeats in one process"
        cond = {"engine": _engine(p), "context": p.get("curve_context"), "kv": "dense",
                # lookahead's forward: the rows pass an explicit (lower-triangular) mask, as its windows do
                "mask": "an explicit mask over the rows (the masked path)", "rows": "k rows of one sequence",
                "per": _FORWARD}
        if base:
            out.append(_line("step", 3, where, 1e3 * base["seconds"], 1e3 * base.get("lo", float("nan")),
                             1e3 * base.get("hi", float("nan")), p.get("curve_repeats"), how, cond))
        for r in rows:
            if r is not base and _finite(r.get("relative")):
                out.append(_line("v", 3, where, r["relative"], how=how, cond=cond, k=int(r["T"])))
    elif chapter == 5:
        rows = [r for r in m.get("c8") or [] if _finite(r.get("step_ms"))]
        one = next((r for r in rows if r.get("batch") == 1), None)
        where = f"{_engine(p)}, {p.get('step_context')}-token context per sequence"
        how = f"median of {p.get('step_repeats')} repeats in one process"
        cond = {"engine": _engine(p), "context": p.get("step_context"),
                "kv": "paged (the serving engine's block view)", "mask": "causal, over each sequence's blocks",
                "rows": "k sequences, one token each", "per": _FORWARD}
        if one:
            out.append(_line("step", 5, where, one["step_ms"], n=p.get("step_repeats"), how=how, cond=cond))
            for r in rows:
                if r is not one:
                    out.append(_line("v", 5, where + " (k sequences, one token each)", r["step_ms"] / one["step_ms"],
                                     how=how, cond=cond, k=int(r["batch"])))
    elif chapter == 6:
        dense: dict[int, list[float]] = {}
        for r in m.get("decode") or []:
            if r.get("pattern") == "dense" and _finite(r.get("ms_per_token")):
                dense.setdefault(int(r["seq_len"]), []).append(float(r["ms_per_token"]))
        for ctx, vals in sorted(dense.items()):
            out.append(_line("step", 6, f"dense attention, {_engine(p)} per-op, context {ctx}",
                             statistics.median(vals), n=len(vals), how=f"median of {len(vals)} repeats in one process",
                             cond={"engine": _engine(p) + " on the per-op path", "context": ctx, "kv": "dense",
                                   "mask": _CAUSAL, "per": "a step of the decode loop"}))
    elif chapter == 8:
        rows = [r for r in m.get("step_cost") or [] if _finite(r.get("ms"))]
        for r in rows:
            prefix = f"a {p['step_prefix']}-token prefix" if p.get("step_prefix") else "the chapter's fixed prefix"
            where = f"{r['arm']}, after {prefix}"
            how = f"median of {r.get('n') or p.get('step_repeats')} interleaved repeats in one process"
            cond = {"engine": _engine_named(r["arm"]), "context": p.get("step_prefix"), "kv": "dense",
                    "mask": _CAUSAL, "rows": "k rows of one sequence", "per": _FORWARD}
            if r.get("rows") == 1:
                out.append(_line("step", 8, where, r["ms"], r.get("ms_low"), r.get("ms_high"), r.get("n"), how,
                                 cond))
            elif _finite(r.get("verify_cost")):
                out.append(_line("v", 8, where, r["verify_cost"], how=how, cond=cond, k=int(r["rows"])))
    return out


def _costs(chapter: int, data: Mapping[str, Any]) -> list[dict]:
    m, p = data.get("measurements") or {}, data.get("params") or {}
    out: list[dict] = []
    if chapter == 2:
        for r in m.get("draft_table") or []:
            if _finite(r.get("measured_c")):
                out.append(_line("c", 2, f"draft {r['draft']} on {_engine(p)}", r["measured_c"],
                                 how="its forward over the target's, timed in one process",
                                 cond={"engine": _engine(p), "draft": str(r["draft"]),
                                       "per": "one-row target steps"}))
        for rows, engine in ((m.get("eagle_trees") or [], _engine(p)),
                             (m.get("eagle_gguf_costs") or [], "gguf weights, fp32 arithmetic")):
            for r in rows:
                if _finite(r.get("c")):
                    out.append(_line("c", 2, f"{r['method']} head on {engine}", r["c"],
                                     how="one head forward over one target step, one process",
                                     cond={"engine": engine, "draft": r["method"], "per": "one-row target steps"}))
    elif chapter == 5:
        s = m.get("speculative_inputs") or {}
        if _finite(s.get("draft_cost")):
            out.append(_line("c", 5, f"{s.get('drafter')} (read from {s.get('source') or 'chapter 2'})",
                             s["draft_cost"], how="read from chapter 2's results, not measured here",
                             cond={"engine": _engine(p), "draft": s.get("drafter"), "per": "one-row target steps",
                                   "read_from": 2}))
    elif chapter == 7:
        a = m.get("alpha") or {}
        if _finite(a.get("cost_ratio")):
            # the drafter's label, without the description the chapter appends ("self:4: layers chosen by ...")
            draft = str(p.get("draft") or "").split(": ", 1)[0] or None
            out.append(_line("c", 7, f"the stack's drafter ({a.get('source') or 'chapter 7'})", a["cost_ratio"],
                             how=f"over {a.get('requests')} requests, one process",
                             cond={"engine": _engine(p), "draft": draft,
                                   # the speculative decoder's own ratio: a draft forward over a verify forward
                                   # (up to gamma + 1 rows, with acceptance), not over a one-row step
                                   "per": "verify steps (up to gamma + 1 rows each, acceptance included)"}))
    return out


# A pair of lines of one quantity under the same conditions whose values still differ, with the reason:
# (kind, chapter, chapter) -> why. None yet: each one found so far differed in a condition, which the card
# states by itself.
REASONS: dict[tuple[str, int, int], str] = {}
# Two values agree when their CIs overlap, or (without both CIs) when they are within this share of each other.
AGREE = 0.05


def _agree(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """One value, read twice: within AGREE of each other, or CIs that overlap. (A CI taken inside one process
    leaves out the variation between processes, so two tight CIs a few per cent apart are one value.)"""
    if abs(a["value"] - b["value"]) <= AGREE * max(abs(a["value"]), abs(b["value"])):
        return True
    return bool(a.get("ci") and b.get("ci") and a["ci"][0] <= b["ci"][1] and b["ci"][0] <= a["ci"][1])


def _quantity(x: Mapping[str, Any]) -> tuple:
    return (x["kind"], x.get("k"), *(str(x["cond"].get(f)) for f in IDENTITY))


def _condition_words(field: str, value: Any) -> str:
    if value is None:
        return "not recorded"
    return f"{value}" if field != "context" or not isinstance(value, int) else f"{value} tokens"


def compare(lines: Iterable[Mapping[str, Any]]) -> tuple[list[dict], list[str]]:
    """Every quantity the card prints more than once with values that disagree, as (notes, defects).

    A note says why two values of one quantity (kind, k, engine, drafter) differ: the conditions that differ
    (context, KV cache, what the rows are, what a cost is counted in), or a reason in REASONS. A defect is a
    pair under the same conditions whose values disagree with no reason given: the check that one quantity
    is never printed with two values and no reason. A line read from another chapter is that chapter's
    number, not a second value."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for x in lines:
        if x["kind"] != "bandwidth" and x.get("cond", {}).get("engine") and "read_from" not in x.get("cond", {}):
            groups.setdefault(_quantity(x), []).append(x)
    merged: dict[tuple, dict] = {}  # the notes of one chapter pair, engine and reason, merged into one
    defects: list[str] = []
    for group in groups.values():
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if a["chapter"] == b["chapter"] or _agree(a, b):
                    continue
                if a["chapter"] > b["chapter"]:
                    a, b = b, a
                name = KIND_TITLES[a["kind"]].split(":")[0].split(" (")[0].lower() + (
                    f" at k = {a['k']}" if a.get("k") else "")
                pair = f"{name} {a['value']:.3g} against {b['value']:.3g}"
                # a condition stated on one side only is a difference too ("not recorded" on the other); a
                # one-row step has no rows to differ in
                fields = [f for f in CONDITION if str(a["cond"].get(f)) != str(b["cond"].get(f))
                          and not (f == "rows" and a["kind"] == "step")]
                reason = REASONS.get((a["kind"], a["chapter"], b["chapter"]))
                if fields:
                    why = "they differ in " + "; ".join(
                        f"{CONDITION_WORDS[f]}: {_condition_words(f, a['cond'].get(f))} against "
                        f"{_condition_words(f, b['cond'].get(f))}" for f in fields)
                elif reason:
                    why = reason.rstrip(".")
                else:
                    defects.append(f"{name} on {a['cond']['engine']}: {a['value']:.3g} (chapter {a['chapter']}) and "
                                   f"{b['value']:.3g} (chapter {b['chapter']}) disagree under the same conditions, "
                                   "and no reason is stated")
                    continue
                key = (a["chapter"], b["chapter"], a["cond"]["engine"], a["cond"].get("draft"), why)
                note = merged.setdefault(key, {"kinds": [], "chapters": [a["chapter"], b["chapter"]], "pairs": []})
                note["kinds"].append(a["kind"])
                note["pairs"].append(pair)
    notes = []
    for (ca, cb, engine, draft, why), n in merged.items():
        what = engine + (f", drafter {draft}" if draft else "")
        notes.append({"kinds": sorted(set(n["kinds"])), "chapters": n["chapters"],
                      "text": f"Chapters {ca} and {cb}, {what}: {'; '.join(n['pairs'])}. {why[:1].upper() + why[1:]}."})
    return notes, defects


def card(out: Path, executed: Mapping[int, Any] | None = None) -> dict[str, Any]:
    """The card of the run whose results are in ``out``: every line, then the bandwidth over every whole
    run of every chapter (median, range, count): the one machine-level number all chapters share.
    ``executed``: the executed notebooks by chapter, when the caller has read them already."""
    lines: list[dict] = []
    index = Path(out) / "index.json"
    runs = (json.loads(index.read_text(encoding="utf-8")).get("chapters") or {}) if index.exists() else {}
    for ch in CHAPTERS:
        data = _chapter(out, ch)
        if data:
            # a chapter's JSON keeps the common parameters; the run's record in index.json has all of them
            nb = executed[ch] if executed is not None and ch in executed else _read_notebook(out, ch)
            data = {**data, "params": {**_executed_params(nb), **((runs.get(str(ch)) or {}).get("params") or {}),
                                       **(data.get("params") or {})}}
            lines += _bandwidth(ch, data) + _steps_and_v(ch, data) + _costs(ch, data)
    bw = [x["value"] for x in lines if x["kind"] == "bandwidth"]
    summary = ({"median": statistics.median(bw), "low": min(bw), "high": max(bw), "runs": len(bw),
                "chapters": sorted({x["chapter"] for x in lines if x["kind"] == "bandwidth"})} if bw else None)
    notes, defects = compare(lines)
    return {"bandwidth": summary, "lines": lines, "notes": notes, "defects": defects}


def write(out: Path) -> Path:
    path = Path(out) / "instrument.json"
    path.write_text(json.dumps(card(out), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------- HTML


def _fmt(x: Mapping[str, Any]) -> str:
    v = x["value"]
    s = f"{v:.3g}"
    if x.get("ci"):
        s += f" [{x['ci'][0]:.3g}, {x['ci'][1]:.3g}]"
    return s


def _rows(lines: Iterable[Mapping[str, Any]], here: int | None) -> str:
    out = []
    for x in lines:
        who = ("this chapter" if x["chapter"] == here else
               f"<a href='ch{x['chapter']:02d}.html'>chapter {x['chapter']}</a>")
        k = f"<td>{x['k']}</td>" if "k" in x else "<td></td>"
        out.append(f"<tr><td>{who}</td>{k}<td>{html.escape(x['what'])}</td><td><b>{html.escape(_fmt(x))}</b></td>"
                   f"<td>{html.escape(x['how'])}</td></tr>")
    return "".join(out)


def _bandwidth_sentence(c: Mapping[str, Any], chapter: int | None) -> str:
    b = c.get("bandwidth")
    if not b:
        return ""
    mine = [x["value"] for x in c["lines"] if x["kind"] == "bandwidth" and x["chapter"] == chapter]
    s = (f"The read bandwidth, measured at the start of every whole run of every chapter: median "
         f"<b>{b['median']:.3g} GB/s</b>, from {b['low']:.3g} to {b['high']:.3g} over {b['runs']} runs "
         f"(chapters {', '.join(map(str, b['chapters']))}).")
    if mine:
        s += (f" This chapter's {len(mine)} runs saw {min(mine):.3g} to {max(mine):.3g} GB/s.")
    return f"<p>{s}</p>"


def block(out: Path, chapter: int | None = None, found: Mapping[str, Any] | None = None) -> str:
    """HTML of the card: every line (``chapter`` None, the front page) or the lines ``chapter`` measured
    (its page), each beside its conditions. ``found``: ``card(out)`` when the caller has read it already."""
    c = card(out) if found is None else found
    if not c["lines"]:
        return ""
    parts = [_bandwidth_sentence(c, chapter)]
    for kind in KINDS[1:]:
        lines = [x for x in c["lines"] if x["kind"] == kind and (chapter is None or x["chapter"] == chapter)]
        if not lines:
            continue
        head = "<th>k</th>" if kind == "v" else "<th></th>"
        parts.append(f"<p><b>{html.escape(KIND_TITLES[kind])}.</b></p><div class='table-wrap'><table class='card'>"
                     f"<tr><th>measured in</th>{head}<th>engine and conditions</th><th>value</th><th>how</th></tr>"
                     f"{_rows(lines, chapter)}</table></div>")
    why = [n["text"] for n in c.get("notes", []) if chapter is None or chapter in n["chapters"]]
    if why:
        parts.append("<div class='card-why'><p><b>Why one quantity reads differently across chapters:</b></p><ul>"
                     + "".join(f"<li>{html.escape(t)}</li>" for t in why) + "</ul></div>")
    if chapter is None:
        return "".join(parts)
    if len(parts) == 1 and not parts[0]:
        return ""
    return ("<div class='instrument'><h4>The instrument card: what this chapter measured of the machine</h4>"
            + "".join(parts) + "<p>The whole card, every chapter's lines side by side, is on the "
            "<a href='index.html#instrument'>front page</a>.</p></div>")
