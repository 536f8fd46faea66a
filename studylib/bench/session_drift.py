"""Run-to-run drift: the spread of a machine-level number that one chapter's whole runs cannot see.

A chapter's whole runs run back to back, within a few minutes of each other, so they agree closely (t on
their logs), yet the same code run cold again an hour later, or in another session on another host, moves
by more: chapter 8's q8_0 speed-up read 3.74 and 3.23 in two cold runs of one code an hour apart, its ten
runs inside each within a few percent. So a claim about the machine class has two variance components:
between the runs inside one chapter run (which the runs measure) and between cold runs of the chapter
(which they cannot). ``stats.run_estimate`` adds the second as a *declared* standard deviation on the log
scale:

    half-width = sqrt((t_{n-1} * s / sqrt(n))**2 + (t_{df_between} * sd_between)**2)

(both t at the CI's confidence; a sum of squares of the two half-widths, which is at least the interval
of the combined variance, so the coverage errs on the safe side). sd_between is itself an estimate from a
few cold runs, so its quantile is Student's t on the degrees of freedom it was estimated with, not z: a
spread seen in few runs widens the interval more than one seen in many.

How it is estimated (``estimate_from_ledger``): every ledger line is one cold run of a chapter. Lines are
grouped by the chapter's code fingerprint, so a change of code is never counted as drift (an earlier rule
grouped by commit and so pooled code changes in), and a group holds the same code on whatever host and at
whatever hour it ran: reruns in one session and reruns in another alike. The spread is pooled per chapter,
because chapters' quantities differ in how much the machine moves them (chapter 8's formats are timed
against an fp32 reference that streams 540 MB a token; chapter 6's arms read the same cache), and its
degrees of freedom are the chapter's independent lines, not its rows (one machine draw moves every number
of a line together). A pool averages its rows, so a row that drifts more than its neighbours would be widened
by less than its own spread (a referee found chapter 8's q8_0 row drifting by an sd of ~0.06 on its own pairs
while the chapter declared 0.05; with the pair after it, gguf@int8's 0.08 is the chapter's widest): where a row has ``MIN_ROW_DF`` or more same-code pairs and drifts more than its chapter's
pool, the chapter declares that row's sd on that row's df. Every row is then widened by at least its own
drift; the steady rows are over-widened, which errs on the safe side. A row is filed under the chapter whose
ledger line carries it, which is the chapter that judges it: chapter 7's throughput row is timed in chapter
5's whole runs (and widened by chapter 5's declaration there), yet its pairs also count toward chapter 7's
declaration, which can only widen chapter 7's own runs.

The declared values are fixed here, before the run that they widen, from the ledger lines written up to
``AS_OF`` (``python -m studylib.bench.session_drift`` prints the estimate beside the declaration). They are
rounded *up* to two decimals. The estimate does not subtract the within-run error from the differences
between lines, so it overstates the drift: conservative, never flattering. The ledger of the run being
judged never feeds its own widening. A chapter with no two cold runs of one code takes its kind's widest
declared sd on its fewest degrees of freedom.

Two kinds, because they drift differently:

- ``arm_vs_arm``: a speed-up or gain of one arm over another, both timed side by side in each run;
  the machine's state falls on both arms and mostly cancels;
- ``vs_machine``: a number against the machine itself (the share of a step that scales with the bytes
  read, the fraction of the probed bandwidth, tokens/s, throughput); nothing cancels.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from studylib.verdict import LEGACY_UNITS, RUNS

ARM_VS_ARM, VS_MACHINE = "arm_vs_arm", "vs_machine"
# Declared before the run (see the module docstring): sd of log(value) between cold runs of one chapter's
# code, per (chapter, kind), and the degrees of freedom each was estimated with (its quantile is t on them).
AS_OF = "2026-12-07T16:45:00+00:00"
DECLARED = {(1, VS_MACHINE): 0.09, (2, ARM_VS_ARM): 0.05, (3, ARM_VS_ARM): 0.04, (5, ARM_VS_ARM): 0.04,
            (6, ARM_VS_ARM): 0.02, (7, ARM_VS_ARM): 0.04, (8, ARM_VS_ARM): 0.09}
DECLARED_DF = {(1, VS_MACHINE): 11, (2, ARM_VS_ARM): 9, (3, ARM_VS_ARM): 9, (5, ARM_VS_ARM): 8,
               (6, ARM_VS_ARM): 8, (7, ARM_VS_ARM): 8, (8, ARM_VS_ARM): 7}
# Whole-run metric keys (``WholeRuns`` metrics) measured against the machine rather than arm against arm.
VS_MACHINE_METRICS = ("bytes_share", "bandwidth_fraction", "tok_s", "throughput")
# In the ledger a row carries its claim, not its metric key: C1's whole-run row is the bytes share and
# C2's the bandwidth fraction (both against the machine); every other whole-run row is a speed-up or gain.
VS_MACHINE_CLAIMS = ("C1", "C2")
# A row's own sd stands for its chapter only when that row repeated in at least this many independent
# cold-run pairs (its df): fewer, and its sd is too rough to pick out the row that drifts most.
MIN_ROW_DF = 5
RUN_UNITS = (RUNS, *LEGACY_UNITS)  # the unit and its earlier names, as older ledger lines carry them
_CHAPTER = re.compile(r"(?:^|\.)ch(\d+)_")


def kind_of(metric: str) -> str:
    """The drift kind of a whole-run metric key ("speedup:xsum", "bandwidth_fraction:gguf", ...)."""
    return VS_MACHINE if metric.split(":", 1)[0] in VS_MACHINE_METRICS else ARM_VS_ARM


def chapter_of(target: str) -> int | None:
    """The chapter whose timing section ``target`` ("studylib.experiments.ch08_compression:fn") is, if any."""
    m = _CHAPTER.search(target.partition(":")[0])
    return int(m.group(1)) if m else None


def _declared(metric: str, chapter: int | None) -> tuple[float, int]:
    """The (sd, df) declared for ``metric`` measured in ``chapter``. A chapter with no declaration of that kind
    (no two cold runs of one code yet) takes the kind's widest sd on its fewest df: never a flattering one."""
    kind = kind_of(metric)
    if (chapter, kind) in DECLARED:
        return DECLARED[(chapter, kind)], DECLARED_DF[(chapter, kind)]
    same = [k for k in DECLARED if k[1] == kind] or list(DECLARED)
    return max(DECLARED[k] for k in same), min(DECLARED_DF[k] for k in same)


def sd_between(metric: str, chapter: int | None = None) -> float:
    """The declared drift sd (log scale) that widens ``metric``'s CI over whole runs in ``chapter``."""
    return _declared(metric, chapter)[0]


def df_between(metric: str, chapter: int | None = None) -> int:
    """The degrees of freedom ``sd_between(metric, chapter)`` was estimated with (its quantile is t on them)."""
    return _declared(metric, chapter)[1]


def estimate_from_ledger(lines: Iterable[Mapping[str, Any]], as_of: str = AS_OF) -> dict[tuple, dict[str, float]]:
    """The drift between cold runs of one chapter's code, per (chapter, kind), from the ledger lines written
    up to ``as_of``. Returns {(chapter, kind): {"sd", "df", "row"}}: the pooled sd and df, or, where a row
    with ``MIN_ROW_DF`` or more same-code pairs drifts more, that row's own sd and df ("row" names it; None when
    the pool stands).

    A run is a ledger line, every one of them: a chapter run twice at one commit is two draws of the machine
    (the pairs of cold runs are exactly that), and a disturbed attempt left in can only widen. Lines are
    grouped by the chapter's code and parameter fingerprints, so a change of either never counts as drift,
    and a group's lines are the same code on whatever host and at whatever hour it ran. For each whole-run row (claim, metric text) of a group, the log values' deviations
    from their mean are pooled per chapter and kind: sd^2 = sum of squared deviations / sum of (values - 1).
    The rows of one line move together (one machine draw moves every number measured in it), so they add no
    degrees of freedom: df is the chapter's independent lines, sum over its groups of (lines - 1), counting
    the lines of a group's most-repeated pooled row."""
    kept = [line for line in lines if str(line.get("written") or "") <= as_of and line.get("commit")]
    values: dict[tuple, list[float]] = defaultdict(list)
    for line in kept:
        # one code and one set of parameters: a change of either is never drift
        group = (line.get("profile"), line.get("chapter"), line.get("code") or line.get("commit"), line.get("params"))
        for row in line.get("rows") or []:
            m = row.get("measured")
            if row.get("unit") in RUN_UNITS and isinstance(m, int | float) and m > 0 and math.isfinite(m):
                kind = VS_MACHINE if row.get("id") in VS_MACHINE_CLAIMS else ARM_VS_ARM
                values[(*group, kind, row.get("id"), row.get("metric"))].append(math.log(m))
    ss: dict[tuple, float] = defaultdict(float)
    pooled: dict[tuple, int] = defaultdict(int)
    row_ss: dict[tuple, float] = defaultdict(float)
    row_n: dict[tuple, int] = defaultdict(int)
    group_df: dict[tuple, int] = defaultdict(int)
    for (_, chapter, code, params, kind, claim, metric), logs in values.items():
        if len(logs) < 2:
            continue  # a row seen once (its metric text names its own numbers) pools nothing
        mean = sum(logs) / len(logs)
        dev = sum((x - mean) ** 2 for x in logs)
        ss[(chapter, kind)] += dev
        pooled[(chapter, kind)] += len(logs) - 1
        row_ss[(chapter, kind, claim, metric)] += dev
        row_n[(chapter, kind, claim, metric)] += len(logs) - 1
        # a group's independent lines are those of its most-repeated pooled row, less one
        group_df[(chapter, kind, code, params)] = max(group_df[(chapter, kind, code, params)], len(logs) - 1)
    df: dict[tuple, int] = defaultdict(int)
    for (chapter, kind, _, _), d in group_df.items():
        df[(chapter, kind)] += d
    out = {k: {"sd": math.sqrt(ss[k] / pooled[k]), "df": float(df[k]), "row": None} for k in pooled}
    # A chapter's pooled sd averages its rows, so a row that drifts more than its neighbours (chapter 8's
    # gguf@int8 against q4_1) would be widened by less than its own spread. The declaration takes the larger
    # of the pooled sd and its most-drifting row's own sd, on that row's df: every row of the chapter is
    # widened by at least its own drift, at the price of over-widening the steady rows (never flattering).
    for (chapter, kind, claim, metric), n in row_n.items():
        if n >= MIN_ROW_DF:
            sd = math.sqrt(row_ss[(chapter, kind, claim, metric)] / n)
            if sd > out[(chapter, kind)]["sd"]:
                out[(chapter, kind)] = {"sd": sd, "df": float(n), "row": f"{claim}: {metric}"}
    return out


def declared_from(estimates: Mapping[tuple, Mapping[str, float]]) -> dict[tuple, float]:
    """The declaration that ``estimates`` give: each sd rounded up to two decimals."""
    return {k: math.ceil(v["sd"] * 100 - 1e-9) / 100 for k, v in estimates.items()}


def main() -> int:
    from studylib import ledger

    est = estimate_from_ledger(ledger.read())
    for k, v in sorted(est.items()):
        print(f"chapter {k[0]}, {k[1]}: sd {v['sd']:.4f} over {v['df']:g} df "
              f"({'its row ' + repr(v['row']) if v['row'] else 'pooled over its rows'}) -> declare "
              f"{declared_from(est)[k]:.2f} on {v['df']:g} df (declared now {DECLARED.get(k)} on {DECLARED_DF.get(k)} df)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
