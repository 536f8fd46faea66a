"""The front page's "why": one model of what a speed-up is made of, this run's factors beside the papers'.

Every decoder in the study trades extra rows per step for fewer steps, and every batcher shares one
step among k requests. Both are paid for in the same currency, v(k): what a step of k rows costs in
one-row steps. So one model explains the verdicts:

- speculation: speed-up = tau / (v(rows verified) + draft forwards x c), where tau is the tokens each
  target forward yields and c what one draft forward costs in target steps (a draft tree verifies all
  its nodes and the root after one draft forward per level; a chain of gamma verifies gamma + 1 rows
  after gamma);
- batching: throughput gain = k / v(k).

This module reads tau, v and c from the chapters' saved results (the same numbers their pages show),
puts the model's speed-up beside the measured ones and beside the published values of the methods' own
papers (``data/published_values.yaml``, each with its citation, hardware and model), then asks when
the claims would hold: the same tau and c with v(k) from the sweep's largest model and from a GPU's
published roofline. Everything here is a labelled model: it never decides a verdict, which the
chapters take from measurements alone. A chapter JSON without these fields leaves its row out.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studylib.code_registration import REPO_ROOT
from studylib.errors import StudylibError
from studylib.workbook.same_kind import _chapter_data as _chapter
from studylib.workbook.same_kind import _finite
from studylib.workbook.tables import model_words, words

PUBLISHED = REPO_ROOT / "data" / "published_values.yaml"
ENTRY_KEYS = ("method", "quantity", "value", "condition", "hardware", "model", "baseline", "source", "url")
HARDWARE_KEYS = ("name", "peak_tflops", "bandwidth_tbs", "source", "url")
QUANTITIES = ("tau", "speedup", "throughput_gain", "v_k", "attention_speedup")
# Which published methods stand beside which row of the study. A survey's entry (``method: spec_bench``)
# stands beside the row of the method it measured (its ``measures`` field).
PEERS = {"eagle": ("eagle", "eagle2", "medusa"), "lookahead": ("lookahead", "jacobi"), "batching": ("vllm", "sglang")}
SURVEY_ROWS = {"eagle": ("eagle", "eagle2"), "lookahead": ("lookahead",)}


# ------------------------------------------------------------------------------------------ the model


def speculation_speedup(tau: float, v_rows: float, drafts: float, c: float) -> float:
    """tau / (v(rows verified) + draft forwards x c): target steps saved per unit of step time spent."""
    if not _finite(tau, v_rows, drafts, c) or v_rows + drafts * c <= 0:
        return float("nan")
    return tau / (v_rows + drafts * c)


def batching_gain(k: float, v_k: float) -> float:
    """k / v(k): k requests share a step that costs v(k) one-row steps."""
    return k / v_k if _finite(k, v_k) and v_k > 0 else float("nan")


def roofline_v(k: float, peak_tflops: float, bandwidth_tbs: float, bytes_per_weight: float = 2.0) -> float:
    """v(k) of a step that reads every weight once and does 2 FLOPs per weight per row, on a machine of
    the given peak and bandwidth: max(read, k rows of arithmetic) / max(read, one row of arithmetic).
    Weight reads only (no KV cache, no launch overhead): an optimistic, labelled model."""
    read = bytes_per_weight / (bandwidth_tbs * 1e12)
    row = 2.0 / (peak_tflops * 1e12)
    return max(read, k * row) / max(read, row)


# ------------------------------------------------------------------------------------ published values


def _number_or_range(v: Any) -> bool:
    if isinstance(v, list):
        return len(v) == 2 and all(_finite(x) for x in v) and v[0] <= v[1]
    return _finite(v)


def published(path: str | Path | None = None) -> dict[str, Any]:
    """The committed table of published values: {"entries": [...], "hardware": [...]}, checked: a bad
    file is refused with every problem named."""
    import yaml

    path = Path(path or PUBLISHED)
    if not path.exists():
        return {"entries": [], "hardware": []}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise StudylibError(f"{path}: not valid YAML ({exc}); fix the file.") from None
    entries, hardware = data.get("entries") or [], data.get("hardware") or []
    problems = []
    for i, e in enumerate(entries):
        missing = [k for k in ENTRY_KEYS if not isinstance(e, Mapping) or k not in e]
        if missing:
            problems.append(f"entry {i} lacks {', '.join(missing)}")
        elif e["quantity"] not in QUANTITIES:
            problems.append(f"entry {i}: quantity {e['quantity']!r} is not one of {', '.join(QUANTITIES)}")
        elif not _number_or_range(e["value"]):
            problems.append(f"entry {i}: value {e['value']!r} is not a number or a [low, high] pair of numbers")
    for i, h in enumerate(hardware):
        missing = [k for k in HARDWARE_KEYS if not isinstance(h, Mapping) or k not in h]
        if missing:
            problems.append(f"hardware {i} lacks {', '.join(missing)}")
        elif not (_finite(h["peak_tflops"], h["bandwidth_tbs"]) and h["peak_tflops"] > 0 and h["bandwidth_tbs"] > 0):
            problems.append(f"hardware {i}: peak_tflops and bandwidth_tbs must be positive numbers")
    if problems:
        raise StudylibError(f"{path}: " + "; ".join(problems) + "; every entry needs " + ", ".join(ENTRY_KEYS)
                            + " and every hardware line " + ", ".join(HARDWARE_KEYS))
    return {"entries": list(entries), "hardware": list(hardware)}


def _value(e: Mapping[str, Any]) -> str:
    v = e["value"]
    return f"{v[0]:g}-{v[1]:g}" if isinstance(v, list) else f"{v:g}"


def _title(source: str) -> str:
    """A short link text: the quoted title where the citation has one, else its first words."""
    m = re.search(r"'([^']+)'", source)
    if m:
        return m.group(1)
    if len(source) <= 60:
        return source
    # cut between words, never inside one ("BF16 Tensor Core 1,97" once cut "1,979 TFLOPS")
    return source[:60].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def _link(text: str, url: str) -> str:
    return f"<a href='{html.escape(str(url))}'>{html.escape(str(text))}</a>"


_UNSTATED = "not stated in the retrieved passage"


def _cite(e: Mapping[str, Any]) -> str:
    model, hardware = str(e["model"]), str(e["hardware"])
    where = (f"model and hardware {_UNSTATED}" if model == hardware == _UNSTATED
             else f"{model}, hardware {_UNSTATED}" if hardware == _UNSTATED else f"{model}, {hardware}")
    return (f"{str(e['quantity']).replace('_', ' ')} {_value(e)} vs {html.escape(str(e['baseline']))} "
            f"({html.escape(where)}; {_link(_title(str(e['source'])), e['url'])})")


def _peers(table: Mapping[str, Any], row: str) -> list[Mapping[str, Any]]:
    own = set(PEERS.get(row, ()))
    survey = set(SURVEY_ROWS.get(row, ()))
    return [e for e in table["entries"] if e["quantity"] in ("tau", "speedup", "throughput_gain")
            and (e["method"] in own or (e.get("measures") in survey))]


# ------------------------------------------------------------------------------------ this run's factors


def _verdict(data: Mapping[str, Any] | None, prefix: str) -> Mapping[str, Any] | None:
    for v in (data or {}).get("verdicts") or []:
        if str(v.get("metric", "")).startswith(prefix) and _finite(v.get("measured")):
            return v
    return None


def _fmt(x: Any, digits: str = ".2f") -> str:
    return format(x, digits) if _finite(x) else "n/a"


def _measured(v: Mapping[str, Any] | None) -> str:
    if v is None:
        return "not measured"
    s = f"{v['measured']:.2f}x"
    ci = v.get("ci") or ()
    if len(ci) == 2 and _finite(*ci):
        s += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    if v.get("n"):
        s += f" (n={v['n']}{' ' + html.escape(str(v['unit'])) if v.get('unit') else ''})"
    if _finite(v.get("threshold")):
        s += f", bar {v['threshold']:g}"
    return s


def factors(out: Path) -> list[dict[str, Any]]:
    """One row per technique the model covers, from the chapters in ``out``: its factors, the model's
    speed-up from them, and the measured speed-up that decides its claim."""
    out = Path(out)
    rows: list[dict[str, Any]] = []
    ch2 = _chapter(out, 2)
    head = ((ch2 or {}).get("params") or {}).get("headline")
    for t in ((ch2 or {}).get("measurements") or {}).get("eagle_trees") or []:
        if head and t.get("method") == head and _finite(t.get("tau"), t.get("v"), t.get("c"), t.get("verify_tokens"),
                                                          t.get("draft_forwards_per_step")):
            rows.append({
                "row": "eagle", "chapter": 2, "technique": f"EAGLE draft tree {head}", "tau": t["tau"],
                "rows": int(t["verify_tokens"]), "drafts": float(t["draft_forwards_per_step"]), "c": t["c"],
                "v": t["v"], "model": speculation_speedup(t["tau"], t["v"], t["draft_forwards_per_step"], t["c"]),
                "beside": t.get("speedup"),
                "where": "chapter 2's tree sweep (" + (f"{t['prompts']} prompts, " if t.get("prompts") else "") + "one process)",
                "measured": _verdict(ch2, f"wall-clock speedup over AR, {head}, T=0")})
            break
    ch3 = _chapter(out, 3)
    head = ((ch3 or {}).get("params") or {}).get("headline")
    cm = [r for r in ((ch3 or {}).get("measurements") or {}).get("cost_model") or [] if head and r.get("method") == head]
    decides = _verdict(ch3, f"wall-clock speedup over AR, {head}")
    # the verdict shows one workload (its best condition): the model's factors are that workload's, so the row
    # compares one condition with itself, not a mean over workloads with one of them
    shown = re.search(r"shown: ([\w-]+)", str((decides or {}).get("conditions", "")))
    if shown and any(r.get("workload") == shown.group(1) for r in cm):
        cm = [r for r in cm if r.get("workload") == shown.group(1)]
    if cm and all(_finite(r.get("compression"), r.get("tokens_per_forward"), r.get("predicted_speedup"))
                  and r["predicted_speedup"] > 0 for r in cm):
        n = len(cm)
        rows.append({
            "row": "lookahead", "chapter": 3, "technique": f"lookahead {head}",
            "tau": sum(r["compression"] for r in cm) / n, "rows": sum(r["tokens_per_forward"] for r in cm) / n,
            "drafts": 0.0, "c": 0.0,
            # no drafter: the step of ``rows`` rows is the whole cost, so v is the chapter's own prediction's
            # (tau / predicted speed-up), averaged over its workloads
            "v": sum(r["compression"] / r["predicted_speedup"] for r in cm) / n,
            "model": sum(r["predicted_speedup"] for r in cm) / n,
            "beside": sum(r["speedup"] for r in cm) / n if all(_finite(r.get("speedup")) for r in cm) else None,
            "where": (f"chapter 3's cost model on {cm[0]['workload']}, the workload the verdict shows" if n == 1
                      else f"chapter 3's cost model, mean over {n} workloads"),
            "measured": decides})
    ch5 = _chapter(out, 5)
    c8 = [r for r in ((ch5 or {}).get("measurements") or {}).get("c8") or []
          if _finite(r.get("step_ms"), r.get("batch")) and r["step_ms"] > 0]
    one = next((r for r in c8 if r["batch"] == 1), None)
    big = max(c8, key=lambda r: r["batch"], default=None)
    if one and big and big is not one:
        k, v = int(big["batch"]), big["step_ms"] / one["step_ms"]
        rows.append({"row": "batching", "chapter": 5, "technique": f"continuous batching, {k} requests a step",
                     "tau": float(k), "rows": k, "drafts": 0.0, "c": 0.0, "v": v, "model": batching_gain(k, v),
                     "beside": None, "where": "chapter 5's decode steps of k sequences, one process",
                     "measured": _verdict(ch5, "throughput of continuous batching / sequential")})
    return rows


def _sweep_v(out: Path, k: int) -> tuple[str, float] | None:
    """v(k) at exactly k rows of the int8 engine at the largest model of a rows-by-size sweep, if one ran
    that k (a cell whose results cannot be read is skipped)."""
    best: tuple[float, str, float] | None = None
    for f in sorted((Path(out) / "sweeps").glob("*/ch01-model=*/ch01.json")):
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        rows = [r for r in (data.get("measurements") or {}).get("step_vs_rows") or []
                if str(r.get("engine", "")).endswith("int8") and _finite(r.get("v"), r.get("ms"), r.get("rows"))]
        at = next((r for r in rows if int(r["rows"]) == k), None)
        one = next((r for r in rows if int(r["rows"]) == 1), None)
        if at is not None and one is not None and (best is None or one["ms"] > best[0]):
            model = (data.get("params") or {}).get("model") or f.parent.name.split("=", 1)[1]
            best = (one["ms"], model_words(model), at["v"])
    return (best[1], best[2]) if best else None


def when(out: Path, table: Mapping[str, Any] | None = None,
         rows: Sequence[Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The model at this run's tau and c (``rows``: ``factors(out)`` when the caller has them), with v from
    this machine, from the sweep's largest model and from each GPU's published roofline: when would the
    speculation and batching claims hold?"""
    table = published() if table is None else table
    found = []
    for f in factors(out) if rows is None else rows:
        if f["row"] not in ("eagle", "batching"):
            continue
        k = int(round(f["rows"]))
        vs = [("this machine, this model (measured)", f["v"], "")]
        if (s := _sweep_v(out, k)) is not None:
            vs.append((f"this machine, {s[0]} (measured in the sweep)", s[1], ""))
        for hw in table.get("hardware") or []:
            vs.append((f"{hw['name']}, bf16 weights (published roofline; a model)",
                       roofline_v(k, hw["peak_tflops"], hw["bandwidth_tbs"]), _link(_title(hw["source"]), hw["url"])))
        for where, v, cite in vs:
            model = (speculation_speedup(f["tau"], v, f["drafts"], f["c"]) if f["row"] == "eagle"
                     else batching_gain(k, v))
            found.append({"row": f["row"], "technique": f["technique"], "where": where, "cite": cite, "v": v, "k": k,
                          "model": model, "measured": f["measured"]})
    return found


# ------------------------------------------------------------------------------------------------ HTML

DECIDING_FACTOR = {
    "C1": "the share of a step that scales with the bytes read",
    "C2": "the fraction of the probed bandwidth a step achieves",
    "C3": "tau against v(rows verified) + draft forwards x c",
    "C4": "LRU's hits against the clairvoyant optimum's, in a pool smaller than the working set",
    "C5": "k / v(k): how cheaply one step takes more rows",
    "C6": "attention's share of a long-context step, and the quality kept",
    "C7": "the stacked gains, each bounded by the same v(k) and c",
    "C8": "whether one technique's gain survives beside another's",
    "C9": "bytes per weight against the arithmetic each byte costs",
}


def deciding_factor(claim: str) -> str:
    """The factor that decides ``claim`` on this machine, named (no number: the verdict table has those)."""
    return DECIDING_FACTOR.get(claim, "")


def one_line(out: Path, rows: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The model in one sentence for the top of the front page, with this run's factors (``rows``:
    ``factors(out)`` when the caller has them; '' without any)."""
    rows = {f["row"]: f for f in (factors(out) if rows is None else rows)}
    spec, batch = rows.get("eagle"), rows.get("batching")
    if not (spec or batch):
        return ""
    here = []
    if spec:
        here.append(f"the headline draft tree pays v = {spec['v']:.2f} for its {spec['rows']} rows and "
                    f"c = {spec['c']:.2f} per draft forward for tau = {spec['tau']:.2f}")
    if batch:
        here.append(f"a step of {batch['rows']} sequences costs v = {batch['v']:.2f}")
    return ("<p><b>Why, in one line:</b> a step of k rows costs v(k) one-row steps and a draft forward costs c "
            "target steps, so a decoder that yields tau tokens per target forward gains tau / (v(rows) + drafts "
            "&times; c), and a batch of k gains k / v(k). Here " + "; ".join(here) + ". "
            "<a href='#why'>The factors, measured, beside the papers'</a>.</p>")


def _machine(out: Path) -> str:
    prov = (_chapter(Path(out), 2) or _chapter(Path(out), 1) or {}).get("provenance") or {}
    cpu, n = prov.get("gpu") or prov.get("cpu"), prov.get("cpu_count")
    return html.escape(f"{cpu} ({n} cores)" if cpu and n and not prov.get("gpu") else str(cpu or "this machine"))


def baseline(out: Path) -> str:
    """Why the ratios are against our own AR decoder, and what they would read against HF ``generate``: from
    chapter 1's side-by-side benchmark (same machine, same prompts, one run)."""
    bench = ((_chapter(Path(out), 1) or {}).get("measurements") or {}).get("ar_bench") or {}
    rows, hfs = [], []
    for engine, b in bench.items():
        s, hf, ours = (b.get("speedup_vs_hf") or {}), (b.get("hf_tok_s") or {}), (b.get("studylib_tok_s") or {})
        if _finite(s.get("value"), hf.get("value"), ours.get("value")):
            hfs.append(hf["value"])
            ci = (f"95% CI {s['ci_low']:.2f} to {s['ci_high']:.2f}, " if _finite(s.get("ci_low"), s.get("ci_high"))
                  else "")
            weights, _, act = str(engine).partition("@")
            name = f"{weights} weights" + (f", {act} arithmetic" if act else "")
            rows.append(f"on {html.escape(name)} our AR decoder runs at {ours['value']:.1f} tok/s "
                        f"against HF's {hf['value']:.1f}: {s['value']:.2f}x HF ({ci}n={s.get('n')} prompts)")
    if not rows:
        return ""
    return ("<h3>The baseline</h3><p>Every speed-up on these pages is a ratio against our own autoregressive "
            "decoder on the same engine, weights and arithmetic, timed in the same run. That is the fair "
            "baseline: the ratio then isolates the technique, where a ratio against a slower decoder would credit "
            "the technique with the engine's speed too. Against Hugging Face <i>transformers</i> "
            "<code>generate</code> in fp32 (HF) on chapter 1's prompts, " + "; ".join(rows) + ". A technique's "
            "ratio against HF is its ratio against our AR on that engine times that factor." + _hf_spread(hfs)
            + "</p>")


def _hf_spread(hfs: Sequence[float]) -> str:
    """Why HF's own speed reads differently on two rows: it is the same fp32 model, timed again beside each
    engine (in the same process, minutes apart), so the rows differ by that process's timing noise."""
    if len(hfs) < 2 or min(hfs) <= 0 or max(hfs) / min(hfs) < 1.02:
        return ""
    return (f" HF's own speed differs between the rows ({min(hfs):.1f} to {max(hfs):.1f} tok/s) although it runs "
            "the same fp32 model each time: it is timed again beside each engine, minutes apart in one process, "
            "and each factor uses the HF time measured beside it.")


def block(out: Path, table: Mapping[str, Any] | None = None,
          rows: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The HTML of the "why": the model, the factors table beside the papers, the "when", the baseline and
    the published table itself (``rows``: ``factors(out)`` when the caller has them). Empty when no chapter
    that the model reads has run."""
    table = published() if table is None else table
    rows = factors(out) if rows is None else list(rows)
    if not rows:
        return ""
    spec = next((f for f in rows if f["row"] == "eagle"), None)
    here = (f"Here, on {_machine(out)}, the headline draft tree verifies {spec['rows']} rows at v = {spec['v']:.2f} "
            f"one-row steps after {spec['drafts']:g} draft forwards of c = {spec['c']:.2f} each, for tau = "
            f"{spec['tau']:.2f}." if spec else "")
    head = ("<p>Every technique here trades extra rows per step for fewer steps, or shares one step among "
            "several requests, so one model explains the verdicts. A step of k rows costs <b>v(k)</b> one-row "
            "steps; a draft forward costs <b>c</b> target steps; each target forward yields <b>tau</b> tokens. "
            "Then</p><ul><li>speculation: speed-up = tau / (v(rows verified) + draft forwards &times; c) (a draft "
            "tree verifies its nodes and the root after one draft forward per level; a chain of gamma verifies "
            "gamma + 1 rows after gamma);</li><li>batching: throughput gain = k / v(k).</li></ul>"
            f"<p>Where a step is bound by reading the weights, v stays near 1 and tau is the speed-up. {here} The "
            "table reads tau, v and c from the chapters and puts the model beside the speed-up measured under the "
            "same conditions and beside the one that decides the verdict (its workloads and engine path are the "
            "chapter's declared ones, so it can differ from the factors' own run). The model is labelled; the "
            "verdicts come from the last measured column. Batching's model leaves out what a served request also "
            "pays (prefill, scheduling, uneven lengths), so it is an upper bound.</p>")
    body = []
    for f in rows:
        pub = "; ".join(_cite(e) for e in _peers(table, f["row"])) or "none in the table"
        body.append(
            f"<tr><td>{html.escape(f['technique'])} (ch. {f['chapter']}; factors from {html.escape(f['where'])})</td>"
            f"<td>{_fmt(f['tau'])}</td><td>{_fmt(f['rows'], '.3g')}</td><td>{_fmt(f['drafts'], 'g')}</td>"
            f"<td>{_fmt(f['c'])}</td><td>{_fmt(f['v'])}</td><td>{_fmt(f['model'])}x</td>"
            f"<td>{_fmt(f.get('beside'))}{'x' if _finite(f.get('beside')) else ''}</td>"
            f"<td><b>{_measured(f['measured'])}</b></td><td>{pub}</td></tr>")
    factor_table = ("<div class='table-wrap'><table class='card'><tr><th>technique</th><th>tau (or k)</th>"
                    "<th>rows a step</th><th>draft forwards</th><th>c</th><th>v(rows)</th><th>model</th>"
                    "<th>measured with these factors</th><th>measured (decides)</th>"
                    "<th>published (the methods' papers)</th></tr>" + "".join(body) + "</table></div>")
    w = when(out, table, rows)
    when_html = ""
    if w:
        lines = "".join(f"<tr><td>{html.escape(r['technique'])}</td><td>{html.escape(r['where'])}"
                        f"{' (' + r['cite'] + ')' if r['cite'] else ''}</td><td>{_fmt(r['v'])}</td>"
                        f"<td>{_fmt(r['model'])}x</td><td>{_measured(r['measured'])}</td></tr>" for r in w)
        when_html = ("<h3>When would the claims hold? (a model)</h3><p>The same tau and c as measured here, with "
                     "v(k) from this machine, from the sweep's largest model on this machine, and from a GPU's "
                     "published peak and bandwidth (weight reads only: optimistic). c is kept as measured here, for "
                     "this small target and its draft; beside a large target a draft costs a far smaller share of a "
                     "step, so the GPU rows are pessimistic for speculation. Each row's bar is the one its claim is "
                     "judged by, shown with the measurement. It never decides a verdict.</p><div class='table-wrap'>"
                     "<table class='card'><tr><th>technique</th><th>v(k) from</th><th>v(k)</th><th>model</th>"
                     "<th>measured here (decides)</th></tr>" + lines + "</table></div>")
    pub_html = ""
    if table["entries"]:
        lines = "".join(
            f"<tr><td>{html.escape(words(str(e['method'])))}"
            f"{' (' + html.escape(str(e['measures'])) + ')' if e.get('measures') else ''}</td>"
            f"<td>{html.escape(words(str(e['quantity'])))}</td><td>{_value(e)}</td><td>{html.escape(str(e['condition']))}"
            f"</td><td>{html.escape(str(e['model']))}</td><td>{html.escape(str(e['hardware']))}</td>"
            f"<td>{html.escape(str(e['baseline']))}</td><td>{_link(e['source'], e['url'])}</td></tr>"
            for e in table["entries"])
        pub_html = ("<details><summary>The published values, with their sources</summary><div class='table-wrap'>"
                    "<table class='card'><tr><th>method</th><th>quantity</th><th>value</th><th>condition</th>"
                    "<th>model</th><th>hardware</th><th>against</th><th>source</th></tr>" + lines
                    + "</table></div></details>")
    return head + factor_table + when_html + baseline(out) + pub_html
