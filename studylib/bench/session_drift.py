"""Between-session drift: the spread of a machine-level number that one session's whole runs cannot see.

Five whole runs inside one session agree to about +-1.3% (t on their logs), yet the same chapter run in
another session of the same machine class moved by more: chapter 3's lookahead speed-up from 0.985 to
1.020, chapter 1's bytes share from 0.476 to 0.438. A session is one draw of the machine (the host the
VM landed on, its neighbours, its clocks), so a claim about the machine class has two variance
components: between runs inside a session (which the runs measure) and between sessions (which they
cannot). ``stats.run_estimate`` adds the second as a *declared* standard deviation on the log scale:

    half-width = sqrt((t_{n-1} * s / sqrt(n))**2 + (t_{df_between} * sd_between)**2)

(both t at the CI's confidence; a sum of squares of the two half-widths, which is at least the interval
of the combined variance, so the coverage errs on the safe side). sd_between is itself an estimate from a
few sessions, so its quantile is Student's t on the degrees of freedom it was estimated with, not z: a
spread seen in few sessions widens the interval more than one seen in many.

The declared values are fixed here, before the run that they widen, from the ledger of earlier
sessions (``estimate_from_ledger`` over the lines written up to ``AS_OF``; ``python -m
studylib.bench.session_drift`` prints it). They are rounded *up* to two decimals. The estimate does not
subtract the within-session error from the session differences, so it overstates the between-session
part: conservative, never flattering. The ledger of the run being judged never feeds its own widening.

Two kinds, because they drift differently:

- ``arm_vs_arm``: a speed-up or gain of one arm over another, both timed side by side in each run;
  the machine's state falls on both arms and mostly cancels;
- ``vs_machine``: a number against the machine itself (the share of a step that scales with the bytes
  read, the fraction of the probed bandwidth, tokens/s, throughput); nothing cancels.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from studylib.verdict import LEGACY_UNITS, RUNS

ARM_VS_ARM, VS_MACHINE = "arm_vs_arm", "vs_machine"
# Declared before the run (see the module docstring): sd of log(value) between sessions, per kind.
AS_OF = "2026-12-06T09:00:00+00:00"
DECLARED = {ARM_VS_ARM: 0.04, VS_MACHINE: 0.06}
# the degrees of freedom each sd was estimated with (sessions - 1, pooled): the t quantile's
DECLARED_DF = {ARM_VS_ARM: 3, VS_MACHINE: 4}
# Whole-run metric keys (``WholeRuns`` metrics) measured against the machine rather than arm against arm.
VS_MACHINE_METRICS = ("bytes_share", "bandwidth_fraction", "tok_s", "throughput")
# In the ledger a row carries its claim, not its metric key: C1's whole-run row is the bytes share and
# C2's the bandwidth fraction (both against the machine); every other whole-run row is a speed-up or gain.
VS_MACHINE_CLAIMS = ("C1", "C2")
RUN_UNITS = (RUNS, *LEGACY_UNITS)  # the unit and its earlier names, as older ledger lines carry them


def kind_of(metric: str) -> str:
    """The drift kind of a whole-run metric key ("speedup:xsum", "bandwidth_fraction:gguf", ...)."""
    return VS_MACHINE if metric.split(":", 1)[0] in VS_MACHINE_METRICS else ARM_VS_ARM


def sd_between(metric: str) -> float:
    """The declared between-session sd (log scale) that widens ``metric``'s CI over whole runs."""
    return DECLARED[kind_of(metric)]


def df_between(metric: str) -> int:
    """The degrees of freedom ``sd_between(metric)`` was estimated with (its quantile is t on them)."""
    return DECLARED_DF[kind_of(metric)]


def estimate_from_ledger(lines: Iterable[Mapping[str, Any]], as_of: str = AS_OF) -> dict[str, dict[str, float]]:
    """The pooled between-session sd of log(value), per kind, from the ledger lines written up to ``as_of``.

    A session is a (chapter, commit) pair; when a chapter was run twice at one commit the later line
    stands (an aborted, disturbed attempt is superseded by its clean rerun). For each whole-run row
    (claim, metric text) seen in two or more sessions, the log values' deviations from their mean are
    pooled: sd^2 = sum of squared deviations / sum of (sessions - 1). Returns {kind: {"sd", "df"}}."""
    last: dict[tuple, Mapping[str, Any]] = {}
    for line in lines:
        if str(line.get("written") or "") <= as_of and line.get("commit"):
            last[(line.get("chapter"), line.get("commit"), line.get("profile"))] = line
    values: dict[tuple, list[float]] = defaultdict(list)
    for line in last.values():
        for row in line.get("rows") or []:
            m = row.get("measured")
            if row.get("unit") in RUN_UNITS and isinstance(m, int | float) and m > 0 and math.isfinite(m):
                values[(line.get("profile"), row.get("id"), row.get("metric"))].append(math.log(m))
    ss: dict[str, float] = defaultdict(float)
    pooled: dict[str, int] = defaultdict(int)
    sessions: dict[str, int] = defaultdict(int)
    for (_, claim, _), logs in values.items():
        if len(logs) < 2:
            continue
        kind = VS_MACHINE if claim in VS_MACHINE_CLAIMS else ARM_VS_ARM
        mean = sum(logs) / len(logs)
        ss[kind] += sum((x - mean) ** 2 for x in logs)
        pooled[kind] += len(logs) - 1
        sessions[kind] = max(sessions[kind], len(logs))
    # The rows of one session move together (one machine draw moves every number measured in it), so pooling
    # rows adds no independent evidence: the sd pools every row, but its degrees of freedom are the sessions'
    # own, the most sessions any one row was seen in, minus one (not the pooled sum, which counts one
    # session's correlated rows as independent).
    return {k: {"sd": math.sqrt(ss[k] / pooled[k]), "df": float(sessions[k] - 1)} for k in pooled}


def declared_from(estimates: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The declaration that ``estimates`` give: each sd rounded up to two decimals."""
    return {k: math.ceil(v["sd"] * 100 - 1e-9) / 100 for k, v in estimates.items()}


def main() -> int:
    from studylib import ledger

    est = estimate_from_ledger(ledger.read())
    for k, v in sorted(est.items()):
        print(f"{k}: sd {v['sd']:.4f} over {v['df']:g} df -> declare {declared_from(est)[k]:.2f} on "
              f"{v['df']:g} df (declared now {DECLARED.get(k)} on {DECLARED_DF.get(k)} df)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
