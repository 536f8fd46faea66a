"""The study's claims (C1..C9), verdict records, and the rules that turn measurements into verdicts.

A verdict is never typed by hand: each chapter passes its measurements to a rule and the rule decides.

The rules (every later chapter inherits them):

- A bar (``judge_at_least`` / ``judge_at_most``) is judged per condition (workload, configuration) on
  the 95% CI, never on the point estimate, and only from a CI over at least ``MIN_UNITS[unit]``
  independent units (10 prompts/requests/documents, 5 whole runs):
  - **holds**: in every condition that was run, the CI clears the bar;
  - **holds under conditions**: the CI clears it in at least one named condition; the row lists where
    it does and where it does not;
  - **inconclusive**: no condition's CI clears the bar, but some CI reaches it (or rests on too few
    units to say);
  - **does not hold**: every CI lies wholly on the wrong side of the bar.
- All-or-nothing checks (``judge_checks``: exactness, the distribution test) hold or do not hold.
- One decision per claim and chapter: a claim with parts that must all be true (C6, C7) is decided by
  ``decide_parts`` (the weakest part, on one configuration); a claim with alternative conditions (the
  methods of C3, the interactions of C8) by ``decide_conditions``. ``study_decisions`` makes one line
  per claim for the whole study.

The ids, sections and wording follow ``shared/CLAIMS.md``; the Chinese quotes are taken verbatim from
the source document.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studylib import decisions
from studylib.errors import StudylibError
from studylib.verdict import (  # noqa: F401  (the vocabulary, re-exported: chapters import it from here)
    AT_LEAST,
    AT_MOST,
    CHECK,
    CLAIMS,
    CONDITIONAL,
    DECISION,
    DIRECTIONS,
    FAILS,
    GUARD_ERRORS,
    HOLDS,
    INCONCLUSIVE,
    LEGACY_UNITS,
    MIN_UNITS,
    PART,
    ROLES,
    RUN_CI,
    SOURCE_TITLE_EN,
    SOURCE_TITLE_ZH,
    VERDICTS,
    Claim,
    Verdict,
    corrected_confidence,  # noqa: F401  (re-exported)
    guard,
)

# ----------------------------------------------------------------------------------------- the rules

# How a check row was decided, for the table's method column (a check has no CI of its own).
CHECK_EXACT = "exact check: every unit must pass; one counterexample fails it"
CHECK_OF_CIS = "check over CIs: the interval comparison named in the conditions"


@dataclass(frozen=True)
class Point:
    """A measured value with its 95% CI (None without one) and the number of units behind the CI."""

    value: float
    ci: tuple[float, float] | None
    n: int | None
    mc_error: float = 0.0
    method: str | None = None


def as_point(est: Any) -> Point:
    """Accept an ``Estimate``, a dict with value/ci_low/ci_high/n, a (value, low, high[, n]) tuple or a
    number (a bare number has no CI and so can never clear a bar)."""
    if hasattr(est, "value") and hasattr(est, "ci_low"):
        return _point(est.value, est.ci_low, est.ci_high, getattr(est, "n", None), getattr(est, "mc_error", 0.0),
                      getattr(est, "method", None))
    if isinstance(est, Mapping):
        if "ci_low" in est:
            return _point(est["value"], est["ci_low"], est["ci_high"], est.get("n"), est.get("mc_error", 0.0),
                          est.get("method"))
        return _point(est["value"], None, None, est.get("n"))
    if isinstance(est, Sequence) and not isinstance(est, str) and len(est) in (3, 4):
        return _point(est[0], est[1], est[2], est[3] if len(est) == 4 else None)
    return _point(est, None, None, None)


def _point(value, lo, hi, n, mc_error=0.0, method=None) -> Point:
    value = float("nan") if value is None else float(value)
    ci = None
    if lo is not None and hi is not None:
        lo, hi = float(lo), float(hi)
        if not (math.isnan(lo) or math.isnan(hi)):
            ci = (lo, hi)
    mc = float(mc_error) if mc_error is not None and not math.isnan(float(mc_error)) else 0.0
    # a table cell without a method reads NaN: no method, not a float where a name belongs
    return Point(value, ci, None if n is None else int(n), mc, method if isinstance(method, str) else None)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _describe(p: Point, unit: str) -> str:
    ci = f" [{_fmt(p.ci[0])}, {_fmt(p.ci[1])}]" if p.ci is not None else " (no CI)"
    n = f", n={p.n} {unit}" if p.n is not None else ""
    return f"{_fmt(p.value)}{ci}{n}"


# The state of one condition against a bar: its CI clears it, lies wholly on the wrong side, straddles
# it, or rests on too few units (or none) to say.
CLEARS, MISSES, STRADDLES, UNDERSAMPLED = "clears", "misses", "straddles", "too few units"


def condition_state(p: Point, threshold: float, direction: str, min_n: int) -> str:
    """Where ``p``'s CI lies against the bar. A bound within ``verdict.GUARD_ERRORS`` of its own errors
    (Monte Carlo, or run-to-run between sessions) of the bar, or on it, touches the bar: another seed or
    another run could put it on either side, so it neither clears nor misses."""
    if p.ci is None or p.n is None or p.n < min_n or math.isnan(p.value):
        return UNDERSAMPLED
    lo, hi = p.ci
    err = guard(p.mc_error)
    if direction == AT_LEAST:
        return CLEARS if lo - err > threshold or (err == 0 and lo >= threshold) else (
            MISSES if hi + err < threshold else STRADDLES)
    return CLEARS if hi + err < threshold or (err == 0 and hi <= threshold) else (
        MISSES if lo - err > threshold else STRADDLES)


def verdict_from_states(states: Sequence[str]) -> str:
    """The four-way rule over the conditions that were run (see the module docstring)."""
    if not states:
        raise ValueError("a verdict needs at least one condition")
    if all(s == CLEARS for s in states):
        return HOLDS
    if any(s == CLEARS for s in states):
        return CONDITIONAL
    if all(s == MISSES for s in states):
        return FAILS
    return INCONCLUSIVE


def min_units(unit: str) -> int:
    try:
        return MIN_UNITS[LEGACY_UNITS.get(unit, unit)]
    except KeyError:
        raise ValueError(f"unknown unit {unit!r}; one of {sorted(MIN_UNITS)}") from None


def _judge_bound(claim_id, metric, estimate, threshold, claimed, conditions, chapter, direction, unit,
                 role, by_construction=False, confidence=0.95, tried=None, power=None) -> Verdict:
    word = ">=" if direction == AT_LEAST else "<="
    need = min_units(unit)
    single = not (isinstance(estimate, Mapping) and "value" not in estimate)
    points = {"": as_point(estimate)} if single else {str(k): as_point(v) for k, v in estimate.items()}
    if not points:
        raise ValueError("judge needs at least one estimate")
    states = {k: condition_state(p, threshold, direction, need) for k, p in points.items()}
    # whole runs are counted only from a CI over whole runs: replays in one process are not runs
    not_runs = [k for k, p in points.items() if unit == "whole runs" and p.ci is not None
                and not (p.method or "").startswith(RUN_CI)]
    for k in not_runs:
        states[k] = UNDERSAMPLED
    verdict = verdict_from_states(list(states.values()))
    sign = 1 if direction == AT_LEAST else -1

    def score(k: str) -> float:
        v = points[k].value
        return -math.inf if math.isnan(v) else sign * v

    # The row shows the worst condition when the claim holds everywhere (the bound that covers them
    # all) and the best one otherwise (how close the claim came); the note lists every condition. A
    # condition with too few units to decide is never the one shown while another could decide: its
    # point would stand for the row without the units behind it.
    decidable = [k for k in points if states[k] != UNDERSAMPLED] or list(points)
    shown = min(decidable, key=score) if verdict == HOLDS else max(decidable, key=score)
    p = points[shown]
    notes = []
    if single:
        if states[""] != CLEARS and "" not in not_runs:
            notes.append(_state_note(states[""], p, word, threshold, need, unit, confidence))
    else:
        notes.append(f"shown: {shown}")
        detail = "; ".join(f"{k}: {_describe(points[k], unit)} {states[k]}" for k in points)
        notes.append(f"per condition ({word} {_fmt(threshold)}): {detail}")
        clear = [k for k in points if states[k] == CLEARS]
        if verdict == CONDITIONAL:
            notes.append(f"clears the bar on {', '.join(clear)}; not on "
                         f"{', '.join(k for k in points if k not in clear)}")
        under = [k for k in points if states[k] == UNDERSAMPLED and k not in not_runs]
        if under:
            notes.append(f"fewer than {need} {unit} or no CI on {', '.join(under)}")
    if not_runs:
        notes.append("the CI is not over whole runs (fresh processes), so it counts no whole runs"
                     + (f" on {', '.join(not_runs)}" if not single else ""))
    if power is not None and not power.get("has_power", True) and verdict not in (FAILS, HOLDS) \
            and states.get(shown) != CLEARS:
        # The power rule is for a CI that does not clear the bar: one that clears it has seen enough.
        # The CI is too wide to see the change the bar is about: no verdict either way but "no power".
        verdict = INCONCLUSIVE
        notes.append(f"inconclusive: no power (minimum detectable change {_fmt(power['mdc'])} > "
                     f"{_fmt(abs(1 - threshold))}; about {power.get('n_needed')} {unit} would decide it)")
    if confidence != 0.95:
        notes.append(f"{confidence:.2%} CI: {tried or '?'} configurations tried, Bonferroni-corrected")
    near = [k or "the estimate" for k in points if points[k].ci is not None and points[k].mc_error > 0
            and min(abs(points[k].ci[0] - threshold), abs(points[k].ci[1] - threshold)) <= guard(points[k].mc_error)]
    if near:
        notes.append(f"a CI bound lies within {'its' if GUARD_ERRORS == 1 else f'{GUARD_ERRORS:g}x its'} own error "
                     f"(Monte Carlo error, or run-to-run error over whole runs) of the bar on {', '.join(near)}, so it "
                     "neither clears nor misses it there")
    if p.method and p.method.startswith(RUN_CI) and p.n is not None:
        notes.append(f"CI over {p.n} whole runs: {p.method}; "
                     + ("conservative if the log run values are normal and the declared sd is right"
                        if any(w in p.method for w in ("between cold runs", "between-session")) else "exact if the log run medians are normal"))
    return Verdict(claim_id, "", metric, p.value, p.ci, claimed, verdict, _join(conditions, *notes), chapter,
                   n=p.n, threshold=threshold, direction=direction, role=role, unit=unit,
                   by_construction=by_construction, confidence=confidence, tried=tried, power=power,
                   ci_method=p.method, mc_error=p.mc_error if p.ci is not None else None)


def _state_note(state: str, p: Point, word: str, threshold: float, need: int, unit: str,
                confidence: float = 0.95) -> str:
    if state == UNDERSAMPLED:
        return (f"no CI from at least {need} {unit} (n={p.n}); the rule cannot decide" if p.ci is None or
                p.n is None or p.n < need else "no value")
    if state == STRADDLES:
        return f"the {ci_level(confidence)} CI crosses the bar {word} {_fmt(threshold)}"
    return f"the whole {ci_level(confidence)} CI misses the bar {word} {_fmt(threshold)}"


def judge_at_least(claim_id: str, metric: str, estimate: Any, threshold: float, claimed: str,
                   conditions: str, chapter: int, unit: str = "prompts", role: str = "decision", *,
                   by_construction: bool = False, confidence: float = 0.95, tried: int | None = None,
                   power: dict | None = None) -> Verdict:
    """The claim needs the metric >= ``threshold``. ``estimate`` is one estimate or a mapping of named
    conditions (workloads, configurations) to estimates; each needs a CI from at least
    ``MIN_UNITS[unit]`` independent units, or it cannot clear the bar.

    ``confidence`` is the level the CI was computed at (``corrected_confidence(tried)`` when several
    configurations compete for one decision). ``power`` (a quality row against a task: reference_score,
    chance, mdc, has_power, n_needed) turns a row whose CI cannot see the bar's change into
    "inconclusive: no power". ``by_construction`` marks a row that cannot fail: it is shown, never counted."""
    return _judge_bound(claim_id, metric, estimate, threshold, claimed, conditions, chapter, AT_LEAST, unit,
                        role, by_construction, confidence, tried, power)


def judge_at_most(claim_id: str, metric: str, estimate: Any, threshold: float, claimed: str,
                  conditions: str, chapter: int, unit: str = "prompts", role: str = "decision", *,
                  by_construction: bool = False, confidence: float = 0.95, tried: int | None = None,
                  power: dict | None = None) -> Verdict:
    """Mirror of ``judge_at_least``: the claim needs the metric <= ``threshold``."""
    return _judge_bound(claim_id, metric, estimate, threshold, claimed, conditions, chapter, AT_MOST, unit,
                        role, by_construction, confidence, tried, power)


def judge_checks(claim_id: str, metric: str, checks: Mapping[str, bool], claimed: str, conditions: str,
                 chapter: int, measured: Any = None, role: str = "decision", n: int | None = None,
                 unit: str | None = None, *, by_construction: bool = False, exact: bool = True,
                 confidence: float = 0.95, tried: int | None = None) -> Verdict:
    """All-or-nothing: holds if every named check passes, otherwise does not hold (exactness, the
    distribution test, "outputs identical": a method exact on some workloads only is not exact).

    One counterexample decides "does not hold" at any n. Passing checks decide "holds" only from
    enough units: with ``unit`` set, ``n`` (default: the number of checks, one per unit) must reach
    ``MIN_UNITS[unit]`` or the row is inconclusive. ``unit=None`` is for a structural check that is
    not a sample of anything (one formula against one measurement table). ``exact=False`` is for checks
    that compare CIs (C8's interactions): there a failure is no counterexample, so below the minimum n
    the row is inconclusive whichever way it went; ``confidence`` and ``tried`` record the level of
    the CIs such checks compare (the caller's conditions say why). ``measured`` (optional) is the
    number shown in the table; by default "k/N checks"."""
    if not checks:
        raise ValueError("judge_checks needs at least one check")
    passed = [k for k, v in checks.items() if bool(v)]
    failed = [k for k, v in checks.items() if not bool(v)]
    verdict = HOLDS if not failed else FAILS
    p = as_point(measured) if measured is not None else None
    note = _join(f"fails: {', '.join(failed)}" if failed else "",
                 f"passes: {', '.join(passed)}" if passed else "")
    row_n = p.n if p and p.ci is not None else None
    if unit is not None:
        n = len(checks) if n is None else int(n)
        row_n = n
        if (verdict == HOLDS or not exact) and n < min_units(unit):
            verdict = INCONCLUSIVE
            note = _join(note, f"n={n} < {min_units(unit)} {unit}: too few units to decide")
    return Verdict(claim_id, "", metric, p.value if p else f"{len(passed)}/{len(checks)} checks",
                   p.ci if p else None, claimed, verdict, _join(conditions, note), chapter,
                   n=row_n, threshold=None, direction=CHECK, role=role, unit=unit,
                   by_construction=by_construction, confidence=confidence, tried=tried,
                   ci_method=(p.method if p and p.ci is not None and p.method else
                              CHECK_EXACT if exact else CHECK_OF_CIS),
                   # a shown CI carries its Monte Carlo error like any judged row's, so a reader can see
                   # how far its bounds move with the resampling seed
                   mc_error=p.mc_error if p and p.ci is not None else None)


_ORDER = {HOLDS: 3, CONDITIONAL: 2, INCONCLUSIVE: 1, FAILS: 0}


def decide_parts(claim_id: str, metric: str, parts: Sequence[Verdict], claimed: str, conditions: str,
                 chapter: int) -> list[Verdict]:
    """One decision for a claim with several parts that must all be true at once (C6: linear cost AND
    quality within 1%; C7: quality AND latency AND throughput). The parts must have been judged on the
    same configuration; the decision is the weakest part, and names it. Returns [decision, *parts]
    with the parts marked ``role="part"``."""
    if not parts:
        raise ValueError("decide_parts needs at least one part")
    parts = [dataclasses.replace(p, role=PART) for p in parts]
    counted = [p for p in parts if not p.by_construction]
    shown = _by_construction_note(parts)
    if not counted:
        row = Verdict(claim_id, "", metric, "0 parts that can fail", None, claimed, INCONCLUSIVE,
                      _join(conditions, "every part holds by construction, so nothing was tested", shown),
                      chapter, direction=CHECK, role=DECISION, by_construction=True)
        return [row, *parts]
    weakest = min(counted, key=lambda p: _ORDER[p.verdict])
    verdict = weakest.verdict
    if verdict == HOLDS:
        # a part left uncounted (true by construction) may read otherwise: say which parts "every" means
        note = "every part holds" if len(counted) == len(parts) else "every counted part holds"
    else:
        short = [f"{p.metric}: {p.verdict}" for p in counted if p.verdict != HOLDS]
        note = f"decided by the weakest part ({'; '.join(short)})"
    row = Verdict(claim_id, "", metric, f"{sum(p.verdict == HOLDS for p in counted)}/{len(counted)} parts hold",
                  None, claimed, verdict, _join(conditions, note, shown), chapter, direction=CHECK, role=DECISION)
    return [row, *parts]


def _by_construction_note(rows: Sequence[Verdict]) -> str:
    names = [r.metric for r in rows if r.by_construction]
    return f"not counted, true by construction in whole or in part: {', '.join(names)}" if names else ""


def decide_conditions(claim_id: str, metric: str, rows: Sequence[Verdict], claimed: str, conditions: str,
                      chapter: int, names: Sequence[str] | None = None) -> list[Verdict]:
    """One decision over alternatives, each a condition in its own right (C3: each method; C8: each
    interaction): holds if every one holds, holds under conditions if at least one does (the note lists
    which do and which do not), inconclusive if none holds but one is inconclusive or holds only under
    conditions, does not hold if none does. Returns [decision, *rows as parts]."""
    if not rows:
        raise ValueError("decide_conditions needs at least one row")
    names = list(names) if names is not None else [r.metric for r in rows]
    rows = [dataclasses.replace(r, role=PART) for r in rows]
    shown = _by_construction_note(rows)
    named = [(nm, r) for nm, r in zip(names, rows, strict=True) if not r.by_construction]
    if not named:
        row = Verdict(claim_id, "", metric, "0 conditions that can fail", None, claimed, INCONCLUSIVE,
                      _join(conditions, "every condition holds by construction, so nothing was tested", shown),
                      chapter, direction=CHECK, role=DECISION, by_construction=True)
        return [row, *rows]
    all_rows = rows
    names, rows = [nm for nm, _ in named], [r for _, r in named]
    states = []
    for r in rows:
        states.append(CLEARS if r.verdict == HOLDS else MISSES if r.verdict == FAILS else STRADDLES)
    if any(r.verdict == CONDITIONAL for r in rows) and not any(r.verdict == HOLDS for r in rows):
        verdict = CONDITIONAL  # a condition that holds somewhere is a named condition where it holds
    else:
        verdict = verdict_from_states(states)
    held = [nm + (" (under conditions)" if r.verdict == CONDITIONAL else "")
            for nm, r in zip(names, rows, strict=True) if r.verdict in (HOLDS, CONDITIONAL)]
    # the tally counts what holds outright, as decide_parts' does; a condition that holds only in part
    # is counted beside it, never as a hold
    whole = sum(r.verdict == HOLDS for r in rows)
    partly = sum(r.verdict == CONDITIONAL for r in rows)
    tally = f"{whole}/{len(rows)} hold" + (f", {partly} under conditions" if partly else "")
    not_held = [f"{nm} ({r.verdict})" for nm, r in zip(names, rows, strict=True)
                if r.verdict not in (HOLDS, CONDITIONAL)]
    note = _join(f"holds for: {', '.join(held)}" if held else "",
                 f"not for: {', '.join(not_held)}" if not_held else "", shown)
    row = Verdict(claim_id, "", metric, tally, None, claimed, verdict,
                  _join(conditions, note), chapter, direction=CHECK, role=DECISION)
    return [row, *all_rows]


def study_decisions(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """One line per claim for the whole study: the chapter's decision when one chapter decides it, and
    the chapters taken as conditions (``decide_conditions``) when several do (C3: chapters 2 and 3;
    C8: chapters 5 and 7). The line's ``chapter`` is the first chapter's."""
    out = []
    for cid in CLAIMS:
        rows = sorted((v for v in verdicts if v.id == cid and v.role == DECISION), key=lambda v: v.chapter)
        if not rows:
            continue
        if len(rows) == 1:
            out.append(rows[0])
            continue
        names = [f"chapter {r.chapter}" for r in rows]
        d = decide_conditions(cid, "decision over chapters " + ", ".join(str(r.chapter) for r in rows), rows,
                              rows[0].claimed, "", rows[0].chapter, names=names)[0]
        out.append(d)
    return out


def check_one_decision(verdicts: Sequence[Verdict]) -> None:
    """A chapter's rows must hold exactly one decision row per claim they touch."""
    for cid in dict.fromkeys(v.id for v in verdicts):
        k = sum(1 for v in verdicts if v.id == cid and v.role == DECISION)
        if k != 1:
            raise ValueError(f"claim {cid} has {k} decision rows in this chapter; exactly one is needed "
                             "(use decide_parts or decide_conditions to combine rows)")


# ----------------------------------------------------------------------------------------- display

_COLOURS = {HOLDS: "#d9f2d9", CONDITIONAL: "#fff1c2", INCONCLUSIVE: "#e4e4f0", FAILS: "#f8d4d4"}


def ci_level(confidence: float) -> str:
    """A CI's level as a reader sees it: "95%", or "98.33%" for a Bonferroni-corrected one."""
    return f"{100 * confidence:.4g}%"


def format_measured(measured: Any, ci: tuple[float, float] | None, n: int | None = None,
                    confidence: float = 0.95) -> str:
    """``1.61 [1.00, 3.95] (n=10)``; a CI at another level than 95% (corrected for several configurations
    tried) names its level: ``0.908 [0.886, 0.916] 99.38% CI (n=48)``."""
    if measured is None:
        return "n/a"
    if isinstance(measured, int | float):
        if isinstance(measured, float) and math.isnan(measured):
            return "n/a"
        text = _fmt(float(measured))
        if ci is not None:
            text = f"{text} [{_fmt(ci[0])}, {_fmt(ci[1])}]"
            if abs(confidence - 0.95) > 1e-9:
                text += f" {ci_level(confidence)} CI"
        return f"{text} (n={n})" if n is not None else text
    return str(measured)


# A corrected CI names its level in the cell (format_measured), so the header cannot say 95% for all.
MEASURED_HEADER = "measured [95% CI unless marked] (n)"


def format_bar(v: Verdict) -> str:
    """The numeric bar with its side ("≥ 0.99"), or "all checks" for all-or-nothing rows."""
    if v.direction == CHECK or v.threshold is None:
        return "all checks"
    return f"{'≥' if v.direction == AT_LEAST else '≤'} {_fmt(v.threshold)}"


def bar_with_origin(v: Verdict) -> str:
    """The bar and where it comes from ("≥ 10 (the essay's number)", "≥ 2 (the study's choice)"), as the
    declarations record it; the bar alone where they do not."""
    bar = format_bar(v)
    origin = None if bar == "all checks" else decisions.bar_origin(v)
    return f"{bar} ({origin})" if origin else bar


_SHOWN = re.compile(r"(?:^|; )shown: ([^;]+)")


def shown_condition(v: Verdict) -> str:
    """Which condition a row judged over several shows, in words ("" for a single estimate): the worst
    when the row holds everywhere (the bound that covers all), the best otherwise (how close it came), as
    ``_judge_bound`` picks it. A box that prints the number without it reads one workload as all."""
    m = _SHOWN.search(v.conditions or "")
    if not m:
        return ""
    # how many conditions the row was judged over: the per-condition note's entries, each ending in its state
    detail = (v.conditions or "").partition("per condition (")[2]
    k = len(re.findall(rf"n=\d+ \w+ (?:{CLEARS}|{MISSES}|{STRADDLES}|{UNDERSAMPLED})(?:;|$)", detail))
    if k == 1:
        return f"on {m.group(1).strip()}, the only condition"
    return f"on {m.group(1).strip()}, the {'worst' if v.verdict == HOLDS else 'best'} of {k or 'several'} conditions"


def shown_metric(v: Verdict) -> str:
    """The row's metric with what a reader must know before its verdict: a row that cannot fail, or a
    decision taken from a result that does not follow its declaration."""
    tags = [t for t, on in (("by construction, not counted", v.by_construction), ("exploratory", v.exploratory))
            if on]
    return f"[{'; '.join(tags)}] {v.metric}" if tags else v.metric


def verdict_frame(verdicts: Sequence[Verdict]):
    import pandas as pd

    rows = [{"id": v.id, "role": v.role, "claim": v.claim, "metric": shown_metric(v),
             MEASURED_HEADER: format_measured(v.measured, v.ci, v.n, v.confidence), "bar": bar_with_origin(v),
             "claimed": v.claimed, "verdict": v.verdict, "conditions": v.conditions, "chapter": v.chapter}
            for v in verdicts]
    cols = ["id", "role", "claim", "metric", MEASURED_HEADER, "bar", "claimed", "verdict", "conditions",
            "chapter"]
    return pd.DataFrame(rows, columns=cols)


def verdict_table(verdicts: Sequence[Verdict]):
    """A pandas Styler that renders as a compact HTML table with coloured verdicts (no index); part
    rows are indented under their claim's decision."""
    df = verdict_frame(verdicts)
    df["id"] = [f" {i} (part)" if r == PART else i for i, r in zip(df["id"], df["role"], strict=True)]
    # The claim's words stand above the table (the chapter's claim box, the front page's claims table):
    # repeated on every row they took the width the metric needs.
    df = df.drop(columns=["role", "claim"])
    styler = df.style.hide(axis="index").map(lambda v: f"background-color: {_COLOURS.get(v, '')}",
                                             subset=["verdict"])
    styler = styler.set_table_attributes('class="verdict-table"')
    return styler.set_table_styles([
        {"selector": "", "props": "border-collapse: collapse; font-size: 0.85em; width: 100%;"},
        {"selector": "th", "props": "text-align: left; background: #f0f0f0; padding: 4px 6px;"},
        {"selector": "td", "props": "text-align: left; vertical-align: top; padding: 4px 6px; "
                                    "border-top: 1px solid #ddd;"},
        # readable prose columns (metric, conditions) on a wide screen, yet the table still fits a narrow one
        {"selector": "td.col1, td.col6", "props": "min-width: min(12em, 16vw); max-width: 30em;"},
        {"selector": "td.col0", "props": "white-space: nowrap;"},
        {"selector": "td.col5", "props": "font-weight: bold; overflow-wrap: normal;"},
    ])


def verdict_text(verdicts: Sequence[Verdict], width: int = 48) -> str:
    """Plain-text table for terminals; long cells are shortened."""
    df = verdict_frame(verdicts).drop(columns=["claim"])
    df["conditions"] = df["conditions"].map(lambda s: s if len(s) <= width else s[: width - 3] + "...")
    return df.to_string(index=False)


def verdict_markdown(verdicts: Sequence[Verdict]) -> str:
    """The study's summary as Markdown: one line per claim (``study_decisions``), then every chapter's
    rows with their n, bar and verdict. README's results section is this text, pasted verbatim."""
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| claim | verdict | decided by | chapter |", "|---|---|---|---|"]
    for d in study_decisions(verdicts):
        lines.append(f"| {d.id} | **{d.verdict}** | {cell(shown_metric(d))}: {cell(format_measured(d.measured, d.ci, d.n, d.confidence))} "
                     f"| {d.chapter} |")
    lines += ["", f"| claim | chapter | row | metric | {MEASURED_HEADER} | bar | verdict |",
              "|---|---|---|---|---|---|---|"]
    for v in sorted(verdicts, key=lambda v: (int(v.id[1:]), v.chapter, v.role != DECISION)):
        lines.append(f"| {v.id} | {v.chapter} | {v.role} | {cell(shown_metric(v))} | "
                     f"{cell(format_measured(v.measured, v.ci, v.n, v.confidence))} | {cell(bar_with_origin(v))} | {v.verdict} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- loading

def chapter_files(profile_dir: str | Path) -> list[Path]:
    return sorted(p for p in Path(profile_dir).glob("ch[0-9][0-9].json"))


def load_chapter(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise StudylibError(f"cannot read {path} ({exc}); rerun that chapter with `studylib reproduce`.") from None
    data["verdicts"] = [Verdict.from_dict(v) for v in data.get("verdicts", [])]
    return decisions.apply_registration(data)


def load_verdicts(profile_dir: str | Path) -> list[Verdict]:
    """Every verdict in ``<profile_dir>/chNN.json``, by claim id and chapter, each decision row before
    its parts."""
    out = [v for f in chapter_files(profile_dir) for v in load_chapter(f)["verdicts"]]
    return sorted(out, key=lambda v: (int(v.id[1:]), v.chapter, v.role != DECISION))
