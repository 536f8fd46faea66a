"""The same kind of number in more than one chapter, each beside its conditions.

Chapters 4, 5 and 7 all measure what the prefix cache does to the time to first token, and chapters 5 and 7
both report how much batching raises throughput. The numbers differ because the conditions differ (one
request at a time or a full batch, a long or a short shared prefix), and a reader who meets 14x in one
chapter and 1.2x in another deserves to be told why where the number stands. Each ``Kind`` reads its
figure out of every chapter's saved JSON, with the conditions taken from that run's own parameters; the
chapter pages print the block under their summary and the front page prints all of them.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studylib.workbook.book import format_ci


@dataclass(frozen=True)
class Figure:
    chapter: int
    value: str  # formatted from the measurement, with its CI and n
    conditions: str  # what the number is a ratio of, and under what load, from the run's parameters


@dataclass(frozen=True)
class Kind:
    name: str
    why: str  # why the chapters' figures differ, in general terms (no numbers)
    readers: tuple[tuple[int, Callable[[Mapping[str, Any]], Figure | None]], ...]


def _ci(value: float, low: float | None, high: float | None, n: int | None, unit: str, suffix: str = "x",
        confidence: Any = None) -> str:
    """The figure with its ``suffix`` ("x", " tok/s") and its CI; a corrected interval names its own level."""
    ci = (low, high) if _finite(low, high) else None
    number, _, rest = format_ci(value, ci, n, unit).partition(" (")
    if _finite(confidence) and confidence != 0.95:
        rest = rest.replace("95% CI", f"{100 * confidence:.4g}% CI", 1)
    return f"{number}{suffix}" + (f" ({rest}" if rest else "")


def _finite(*xs: Any) -> bool:
    return all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in xs)


def _ttft_ch04(data: Mapping[str, Any]) -> Figure | None:
    rows = [r for r in (data.get("measurements") or {}).get("summary") or []
            if r.get("workload") != "no_sharing" and _finite(r.get("TTFT speedup"))]
    if not rows:
        return None
    r = next((r for r in rows if r.get("workload") == "system_prompt"), max(rows, key=lambda r: r["TTFT speedup"]))
    lo, hi = (r.get("TTFT speedup CI") or [None, None])[:2]
    p = data.get("params") or {}
    hit = r.get("hit rate")
    return Figure(4, _ci(r["TTFT speedup"], lo, hi, r.get("requests"), "requests"),
                  f"median TTFT without / with the cache, {r['workload']} workload, one request at a time"
                  + (f" behind a {p['system_tokens']}-token shared prompt" if p.get("system_tokens") else "")
                  + (f", {hit:.0%} of prompt tokens found cached" if _finite(hit) else ""))


def _ttft_ch05(data: Mapping[str, Any]) -> Figure | None:
    """Median TTFT of continuous batching without / with the cache at saturation: over the whole runs at C8's
    level where the chapter has them (the interval its C8 row prints), else paired by repeat in one process."""
    from studylib.bench.stats import ratio_estimate
    from studylib.bench.whole_runs import WholeRuns
    from studylib.decisions import level

    p = data.get("params") or {}
    shared = (f" behind {p.get('n_systems', 'a few')} shared {p['system_tokens']}-token prompts"
              if p.get("system_tokens") else "")
    what = ("median TTFT of continuous batching without / with the cache at saturation: "
            f"{p.get('n_requests', 'all')} requests at once{shared}, so most of the wait is in the queue, "
            "which the cache does not shorten")
    whole = (data.get("measurements") or {}).get("whole_runs") or {}
    if whole.get("runs"):
        wr = WholeRuns(whole.get("target", ""), whole.get("params") or {}, whole["runs"])
        if "ttft_gain:continuous" in wr.metrics():
            conf = level("C8", 5)[0]
            e = wr.estimate("ttft_gain:continuous", conf)
            return Figure(5, _ci(e.value, e.ci_low, e.ci_high, e.n, "whole runs", confidence=conf), what)
    runs = [r for r in (data.get("measurements") or {}).get("runs") or [] if r.get("rate") is None]
    by_repeat: dict[Any, dict[str, float]] = {}
    for r in runs:
        if r.get("arm") in ("continuous", "continuous+radix") and _finite(r.get("ttft_p50_s")):
            by_repeat.setdefault(r.get("repeat"), {})[r["arm"]] = r["ttft_p50_s"]
    pairs = [(v["continuous"], v["continuous+radix"]) for v in by_repeat.values() if len(v) == 2]
    if not pairs:
        return None
    est = ratio_estimate([a for a, _ in pairs], [b for _, b in pairs])
    return Figure(5, _ci(est.value, est.ci_low, est.ci_high, est.n, "repeats in one process"), what)


def _ttft_ch07(data: Mapping[str, Any]) -> Figure | None:
    rows = (data.get("measurements") or {}).get("prefix_vs_output") or []
    r = next((r for r in rows if r.get("output_tokens") == 1 and _finite(r.get("speedup"))), None)
    if r is None:
        return None
    p = data.get("params") or {}
    again = next((c for c in (data.get("measurements") or {}).get("confirmation") or []
                  if c.get("workload") == "system_prompt" and c.get("stack") == "prefix cache"
                  and _finite(c.get("ttft_speedup"))), None)
    return Figure(7, _ci(r["speedup"], r.get("low"), r.get("high"), p.get("n_requests"), "requests"),
                  "end-to-end time of a one-token answer (its TTFT) without / with the cache, one request at a "
                  "time" + (f" behind a {p['system_tokens']}-token shared prompt" if p.get("system_tokens") else "")
                  + ", in the pass that chose the stacks"
                  + (f" (the confirmation run's fresh requests gave {again['ttft_speedup']:.3g}x)" if again else "")
                  + "; the same cache gives less as the answer grows (chapter 7's figure)")


def _gain_ch05(data: Mapping[str, Any]) -> Figure | None:
    # the gain over whole runs (the one C5 decides on) where the chapter has it, else its main run's
    m = data.get("measurements") or {}
    found = [(g, unit) for key, unit in (("gains_over_runs", "whole runs"), ("gains", "repeats in one process"))
             for g in m.get(key) or []
             if g.get("treated") == "continuous+radix" and g.get("baseline") == "sequential" and _finite(g.get("gain"))]
    if not found:
        return None
    g, unit = found[0]
    p = data.get("params") or {}
    return Figure(5, _ci(g["gain"], g.get("ci_low"), g.get("ci_high"), g.get("repeats"), unit),
                  f"output tokens/s of continuous batching with the prefix cache / one request at a time, "
                  f"{p.get('n_requests', 'all')} chat requests arriving at once, <= {p.get('max_new_tokens', '?')} "
                  "new tokens each")


def _gain_ch07(data: Mapping[str, Any]) -> Figure | None:
    v = next((v for v in data.get("verdicts") or [] if str(v.get("metric")).startswith("throughput at saturation")),
             None)
    if v is None or not _finite(v.get("measured")):
        return None
    ci = v.get("ci") or (None, None)
    cond = str(v.get("conditions") or "")
    where = ("read from chapter 5's saturation runs (the same measurement), as the throughput part of claim C7"
             if "measured in chapter 5" in cond else "measured by chapter 7 for the throughput part of claim C7")
    return Figure(7, _ci(v["measured"], ci[0], ci[1], v.get("n"), v.get("unit") or "whole runs"), where)


def _decode_ch01(data: Mapping[str, Any]) -> Figure | None:
    b = ((data.get("measurements") or {}).get("ar_bench") or {}).get("gguf") or {}
    e = b.get("studylib_decode_tok_s") or {}
    if not _finite(e.get("value")):
        return None
    return Figure(1, _ci(e["value"], e.get("ci_low"), e.get("ci_high"), e.get("n"), "prompts", " tok/s"),
                  f"the GGUF's 4-bit blocks with fp32 activations, through the generate loop of the side-by-side benchmark, "
                  f"decode steps only, {b.get('prompts', '?')} chat prompts x {b.get('max_new_tokens', '?')} new tokens")


def _decode_ch08(data: Mapping[str, Any]) -> Figure | None:
    rows = {r.get("arm"): r for r in (data.get("measurements") or {}).get("speed") or []}
    r = rows.get("gguf")
    if r is None or not _finite(r.get("decode_tok_s")):
        return None
    text = (f"the same blocks and arithmetic, decode steps timed one by one in the fused C step against the fp32 "
            f"reference on the same path, {r.get('n', '?')} chat prompts")
    i8 = rows.get("gguf@int8")
    if i8 is not None and _finite(i8.get("decode_tok_s")):
        text += ("; with int8 activations " + _ci(i8["decode_tok_s"], i8.get("decode_tok_s_low"),
                                                  i8.get("decode_tok_s_high"), i8.get("n"), "prompts", " tok/s",
                                                  i8.get("confidence")))
    return Figure(8, _ci(r["decode_tok_s"], r.get("decode_tok_s_low"), r.get("decode_tok_s_high"), r.get("n"),
                         "prompts", " tok/s", r.get("confidence")), text)


def _cost_ch02(data: Mapping[str, Any]) -> Figure | None:
    m, p = data.get("measurements") or {}, data.get("params") or {}
    head = m.get("headline") or p.get("headline")
    r = next((r for r in m.get("eagle_trees") or [] if r.get("method") == head and _finite(r.get("c"))), None)
    if r is None:
        return None
    return Figure(2, _ci(r["c"], None, None, r.get("prompts"), "prompts", ""),
                  f"one forward of the drafter chapter 2 decides on ({head}) / one AR step of the same engine "
                  f"({p.get('weights', 'dense')} weights, {p.get('act', 'fp32')} activations), one request at a time")


def _cost_ch05(data: Mapping[str, Any]) -> Figure | None:
    s = (data.get("measurements") or {}).get("speculative_inputs") or {}
    if not _finite(s.get("draft_cost")):
        return None
    return Figure(5, f"{s['draft_cost']:.3g}", f"an input of chapter 5's batching model, not measured there; "
                                               f"taken from {_source(s.get('source', 'its parameters'), 5)}")


def _source(text: Any, chapter: int) -> str:
    """A source the chapter wrote about itself ("this chapter's speculative runs"), named by its chapter:
    the entry is also read on other chapters' pages and the front page, where "this chapter" is another."""
    return str(text or "?").replace("this chapter's", f"chapter {chapter}'s")


def _cost_ch07(data: Mapping[str, Any]) -> Figure | None:
    a = (data.get("measurements") or {}).get("alpha") or {}
    if not _finite(a.get("cost_ratio")):
        return None
    p = data.get("params") or {}
    return Figure(7, _ci(a["cost_ratio"], None, None, a.get("requests") or None, "requests", ""),
                  f"the stack's drafter ({p.get('draft', 'auto')}) timed inside chapter 7's own runs, a draft "
                  f"forward / a target forward of its engine ({p.get('weights', 'dense')} weights); "
                  f"source: {_source(a.get('source'), 7)}")


def _spec_gain_ch05(data: Mapping[str, Any]) -> Figure | None:
    m = data.get("measurements") or {}
    rows = [r for r in m.get("c8") or [] if _finite(r.get("speculative_gain"), r.get("batch"))]
    s = m.get("speculative_inputs") or {}
    if not rows or not _finite(s.get("alpha"), s.get("draft_cost")):
        return None
    r = min(rows, key=lambda r: r["batch"])
    if _finite(s.get("tokens_per_step")):  # chapter 2's headline drafter, as measured there
        fed = (f"{s.get('drafter', 'the headline drafter')}: {s['tokens_per_step']:.2f} tokens per target forward, "
               f"{s.get('draft_forwards', '?'):.3g} draft forwards of cost {s['draft_cost']:.3g} and a verify block "
               f"of {s.get('verify_tokens', '?')} tokens per step")
    else:
        fed = (f"acceptance {s['alpha']:.2f} with {s.get('gamma', '?')} drafts per step, draft cost "
               f"{s['draft_cost']:.3g}")
    return Figure(5, f"{r['speculative_gain']:.3g}x", f"a model at batch {r['batch']} fed {fed}; the verify cost "
                  "measured on chapter 5's engine")


def _spec_gain_ch07(data: Mapping[str, Any]) -> Figure | None:
    m = data.get("measurements") or {}
    rows = [r for r in m.get("spec_gain_vs_batch") or [] if _finite(r.get("gain"), r.get("batch"))]
    a = m.get("alpha") or {}
    if not rows or not _finite(a.get("alpha"), a.get("cost_ratio")):
        return None
    r = min(rows, key=lambda r: r["batch"])
    span = (f" (from the ends of the acceptance CI: {r['gain_low']:.3g} to {r['gain_high']:.3g})"
            if _finite(r.get("gain_low"), r.get("gain_high")) and r["gain_low"] != r["gain_high"] else "")
    return Figure(7, f"{r['gain']:.3g}x", f"a model at batch {r['batch']}{span}: acceptance {a['alpha']:.2f}, "
                  f"draft cost {a['cost_ratio']:.3g}, both from {_source(a.get('source'), 7)}")


KINDS: tuple[Kind, ...] = (
    Kind("Prefix-cache gain in time to first token",
         "the longer the shared prefix and the larger its share of the prompt, the more prefill the cache skips; "
         "with the batch full, requests wait in the queue, and the cache cannot shorten that wait",
         ((4, _ttft_ch04), (7, _ttft_ch07), (5, _ttft_ch05))),
    Kind("Throughput gain of batching over one request at a time",
         "a throughput gain depends on how many requests can share a step, so a smaller workload gives a smaller "
         "gain on the same engine",
         ((5, _gain_ch05), (7, _gain_ch07))),
    Kind("Single-stream decode speed of the 4-bit engine",
         "the chapters time it on different paths (the generate loop with its per-token Python work, or the "
         "decode steps alone), at different contexts and lengths, and with fp32 or int8 activations",
         ((1, _decode_ch01), (8, _decode_ch08))),
    Kind("Draft cost c: one draft forward, in target forwards",
         "each chapter's drafter and engine differ: chapter 2 times the drafter it decides claim C3 on against "
         "an AR step of its own engine; chapter 5 does not measure c but feeds chapter 2's figure (or its "
         "parameters) to its batching model; chapter 7 times its stack's drafter inside its own runs",
         ((2, _cost_ch02), (5, _cost_ch05), (7, _cost_ch07))),
    Kind("Speculative gain at batch 1, from the batching model",
         "both are the same model (tokens per step over the cost of drafting and verifying), fed different "
         "drafters: their tokens per step, draft costs and verify blocks differ (see the draft cost above)",
         ((5, _spec_gain_ch05), (7, _spec_gain_ch07))),
)


def _chapter_data(out: Path, chapter: int) -> Mapping[str, Any] | None:
    f = out / f"ch{chapter:02d}.json"
    if not f.exists():
        return None
    return json.loads(f.read_text(encoding="utf-8"))


def figures(out: Path) -> list[tuple[Kind, list[Figure]]]:
    """Every kind with the figures the chapters in ``out`` have measured (kinds with fewer than two dropped)."""
    cache: dict[int, Mapping[str, Any] | None] = {}
    found = []
    for kind in KINDS:
        figs = []
        for ch, read in kind.readers:
            if ch not in cache:
                cache[ch] = _chapter_data(out, ch)
            fig = read(cache[ch]) if cache[ch] else None
            if fig is not None:
                figs.append(fig)
        if len(figs) >= 2:
            found.append((kind, figs))
    return found


def _item(f: Figure, here: int | None) -> str:
    who = "This chapter" if f.chapter == here else f"<a href='ch{f.chapter:02d}.html'>Chapter {f.chapter}</a>"
    return f"<li>{who}: <b>{html.escape(f.value)}</b>, {html.escape(f.conditions)}.</li>"


def block(out: Path, chapter: int | None = None, found: list[tuple[Kind, list[Figure]]] | None = None) -> str:
    """HTML: for ``chapter``, the kinds it shares with others (its own figure first); for None, every kind.
    ``found``: ``figures(out)`` when the caller renders several pages and has read them once already."""
    parts = []
    for kind, figs in figures(out) if found is None else found:
        if chapter is not None and chapter not in {f.chapter for f in figs}:
            continue
        figs = sorted(figs, key=lambda f: f.chapter != chapter) if chapter is not None else figs
        if len({f.value for f in figs}) == 1:
            lead = "The chapters report the same measurement."
        else:
            lead = f"The figures differ because {html.escape(kind.why)}."
        parts.append(f"<p><b>{html.escape(kind.name)}.</b> {lead}</p>"
                     f"<ul>{''.join(_item(f, chapter) for f in figs)}</ul>")
    if not parts:
        return ""
    if chapter is None:
        return "".join(parts)
    return ("<div class='same-kind'><h4>The same kind of number in other chapters</h4>" + "".join(parts)
            + "</div>")
