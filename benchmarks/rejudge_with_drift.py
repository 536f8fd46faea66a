"""Re-read an earlier committed run's whole-run rows under the declared between-session drift.

    python benchmarks/rejudge_with_drift.py 73aeaf2 [more revisions ...]

For every verdict row decided over whole runs (unit "whole runs", or "repeats" in runs before the
rename) in ``reports/cpu/chNN.json`` at each revision: the stored t interval on the log scale, widened by
the declared sd of its kind in quadrature (``studylib.bench.session_drift``, as ``stats.run_estimate``
does it), and where each interval lies against the row's bar. It re-reads rows, not claims, and it is
exploratory by construction: those runs were judged by the rules of their own commit. It answers one
question for the closing note: would the earlier session's rows read the same as the new run's under
the new rule?
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

from scipy import stats

# A stored row names its claim, not its metric key: kinds by claim, as the declaration's own derivation
# (``session_drift.estimate_from_ledger``) takes them.
from studylib.bench.session_drift import (
    ARM_VS_ARM,
    RUN_UNITS,
    VS_MACHINE,
    VS_MACHINE_CLAIMS,
    df_between,
    sd_between,
)


def rows_at(rev: str):
    for ch in range(1, 9):
        try:
            text = subprocess.run(["git", "show", f"{rev}:reports/cpu/ch{ch:02d}.json"], capture_output=True,
                                  text=True, check=True).stdout
        except subprocess.CalledProcessError:
            continue
        for v in json.loads(text).get("verdicts") or []:
            ci = v.get("ci") or ()
            if (v.get("unit") in RUN_UNITS and len(ci) == 2 and None not in ci and v.get("threshold") is not None
                    and isinstance(v.get("measured"), int | float)):
                yield ch, v


def side(lo: float, hi: float, bar: float, direction: str) -> str:
    if direction == "at_most":
        lo, hi, bar = -hi, -lo, -bar
    return "clears" if lo >= bar else "misses" if hi < bar else "straddles"


def main(revs: list[str]) -> int:
    if not revs:
        print("usage: python benchmarks/rejudge_with_drift.py REV [REV ...]", file=sys.stderr)
        return 2
    for rev in revs:
        print(f"== {rev}")
        for ch, v in rows_at(rev):
            m, (lo, hi) = float(v["measured"]), map(float, v["ci"])
            if not (m > 0 and lo > 0 and hi > 0):
                continue
            half = max(math.log(hi / m), math.log(m / lo))
            kind = VS_MACHINE if v["id"] in VS_MACHINE_CLAIMS else ARM_VS_ARM
            # each chapter's own declaration (a chapter without one takes its kind's widest)
            metric = "bytes_share" if kind == VS_MACHINE else "speedup"
            q = stats.t.ppf((1 + float(v.get("confidence") or 0.95)) / 2, df_between(metric, ch))
            wide = math.hypot(half, q * sd_between(metric, ch))
            nlo, nhi = m * math.exp(-wide), m * math.exp(wide)
            bar, d = float(v["threshold"]), v.get("direction", "at_least")
            print(f"ch{ch} {v['id']} {v['metric'][:70]:70s} {m:.3f} [{lo:.3f}, {hi:.3f}] {side(lo, hi, bar, d):9s}"
                  f" -> [{nlo:.3f}, {nhi:.3f}] {side(nlo, nhi, bar, d):9s} (bar {bar:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
