"""Whole runs: the unit of every machine-level number.

A number such as a bandwidth fraction or a speed-up moves more between processes (where the model's
pages land, the machine's other load, the CPU's clocks) than between prompts inside one process. A CI
over prompts in one run is about +-0.01 wide where separate runs spread +-0.04, so a verdict near its
bar flips from run to run. Here the unit is the whole run:

- a **whole run** is a fresh Python process that reloads the model, measures the read bandwidth again
  and records the machine's load, then runs one chapter's *timing section* only (a function named
  ``module:function``, called with JSON parameters and returning per-run numbers). Quality and
  exactness checks are not repeated: they do not vary between processes;
- a chapter takes ``runs`` >= 5 of them (``whole_runs``); each run gives one value per metric (its own
  median over its prompts), and the decision's CI is Student's t on the log of those values
  (``stats.run_estimate``) with n = runs. The prompt-level CI of the chapter's main run is shown beside
  it, never in its place.

The runs of one chapter start ``gap_s`` seconds apart where a budget allows it, so that a slow drift in
the machine falls between them rather than outside them. Each run's start time, load and bandwidth are
kept in the result, so a page can show the spread it came from.

``python -m studylib.bench.whole_runs module:function`` reads the parameters as JSON on stdin and
writes the run's record as JSON on stdout (the protocol between the parent and each fresh process).
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from studylib.bench.session_drift import chapter_of, df_between, sd_between
from studylib.bench.stats import Estimate, no_ci, run_estimate
from studylib.errors import StudylibError

MIN_RUNS = 5
MARKER = "WHOLE_RUN_RECORD "


@dataclass
class WholeRuns:
    """The records of every whole run of one timing section, in the order they ran."""

    target: str
    params: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)

    def values(self, metric: str) -> list[float]:
        """One value per run of ``metric`` (a key of the dict the timing section returned)."""
        missing = [i for i, r in enumerate(self.runs) if metric not in r["metrics"]]
        if missing:
            raise StudylibError(f"whole runs {missing} of {self.target} returned no {metric!r}; "
                                f"it returned {sorted(self.runs[missing[0]]['metrics'])}")
        return [float(r["metrics"][metric]) for r in self.runs]

    def estimate(self, metric: str, confidence: float = 0.95) -> Estimate:
        """``metric``'s CI over the runs (t on the log of the per-run values, widened by the declared
        drift of its chapter and kind, ``session_drift``). A run whose value is not a
        positive number (a share that came out negative, a throughput of an empty share) leaves the
        metric without a CI, so the rules cannot decide on it, rather than stopping the chapter."""
        import math

        vals = self.values(metric)
        if any(not math.isfinite(v) or v <= 0 for v in vals):
            return no_ci(len(vals), vals, confidence, "no CI: a run's value is not a positive number")
        chapter = chapter_of(self.target)  # each chapter's quantities drift by their own declared amount
        return run_estimate(vals, confidence, session_sd=sd_between(metric, chapter),
                            session_df=df_between(metric, chapter))

    def get(self, metric: str, confidence: float = 0.95) -> Estimate | None:
        """``estimate(metric)``, or None when some run did not measure it (e.g. no bytes fit on a GPU)."""
        return self.estimate(metric, confidence) if metric in self.metrics() else None

    def metrics(self) -> list[str]:
        return sorted(set.intersection(*(set(r["metrics"]) for r in self.runs))) if self.runs else []

    def table(self):
        """One row per run: when it started, the load, the bandwidth it measured and each metric."""
        import pandas as pd

        rows = []
        for i, r in enumerate(self.runs, 1):
            row = {"run": i, "started": r["started"], "load_1min": r["load_before"][0],
                   "bandwidth_gbs": r["bandwidth_gbs"], "seconds": r["seconds"]}
            row.update({k: v for k, v in r["metrics"].items() if isinstance(v, int | float)})
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _load() -> list[float]:
    try:
        return [float(x) for x in os.getloadavg()]
    except OSError:
        return [float("nan")] * 3


def run_one(target: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Run the timing section ``target`` ("module:function") in this process and return its record.

    The function receives ``params`` as keyword arguments (with ``run_index`` and ``run_count`` from
    ``whole_runs``) plus ``bandwidth_gbs``, the read bandwidth measured just before it in this process,
    so it must accept keywords it does not use (``**_``), and returns a mapping of metric names to numbers (and,
    optionally, lists: per-prompt values kept for display)."""
    import torch

    from studylib.bench.roofline import measure_bandwidth_gbs

    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    threads = int(params.get("threads") or 0)
    if threads:
        torch.set_num_threads(threads)
    started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    before = _load()
    t0 = time.perf_counter()
    device = str(params.get("device", "cpu"))
    bw = measure_bandwidth_gbs(device, mbytes=int(params.get("probe_mbytes", 256)), repeats=3)
    metrics = fn(**dict(params), bandwidth_gbs=bw)
    return {"pid": os.getpid(), "started": started, "load_before": before, "load_after": _load(),
            "bandwidth_gbs": float(bw), "seconds": time.perf_counter() - t0, "metrics": dict(metrics)}


def whole_runs(target: str, params: Mapping[str, Any], runs: int = MIN_RUNS, gap_s: float = 0.0,
               progress: bool = True, timeout_s: float = 1800.0) -> WholeRuns:
    """``runs`` whole runs of ``target``, each a fresh process, one after another (``gap_s`` seconds of
    idle between them). Raises ``StudylibError`` naming the run and its last output when one fails."""
    from studylib.progress import progress_bar

    if runs < 2:
        raise StudylibError(f"whole runs need at least 2 runs for a CI ({MIN_RUNS} for a decision); got {runs}.")
    payload = json.dumps(dict(params))
    out = WholeRuns(target, json.loads(payload))
    env = dict(os.environ)
    for i in progress_bar(range(runs), desc=f"whole runs of {target.rpartition(':')[2]}", progress=progress):
        if i and gap_s > 0:
            time.sleep(gap_s)
        # each run knows its place (a timing section may split a workload across runs by it)
        payload_i = json.dumps({**out.params, "run_index": i, "run_count": runs})
        try:
            proc = subprocess.run([sys.executable, "-m", "studylib.bench.whole_runs", target], input=payload_i,
                                  capture_output=True, text=True, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise StudylibError(f"whole run {i + 1} of {target} ran past {timeout_s:g} s; lower its prompts or "
                                "raise timeout_s") from None
        record = next((line[len(MARKER):] for line in reversed(proc.stdout.splitlines()) if line.startswith(MARKER)),
                      None)
        if proc.returncode != 0 or record is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise StudylibError(f"whole run {i + 1} of {target} failed (exit {proc.returncode}): "
                                + " | ".join(tail))
        out.runs.append(json.loads(record))
    return out


def spread_note(runs: WholeRuns, metric: str) -> str:
    """The per-run values of ``metric`` in words, for the row's conditions."""
    vals = runs.values(metric)
    return (f"{len(vals)} whole runs (fresh processes, model reloaded, bandwidth re-measured): "
            + ", ".join(f"{v:.3g}" for v in vals))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or ":" not in argv[0]:
        print("usage: python -m studylib.bench.whole_runs module:function < params.json", file=sys.stderr)
        return 2
    params = json.loads(sys.stdin.read() or "{}")
    record = run_one(argv[0], params)
    print(MARKER + json.dumps(record, allow_nan=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
