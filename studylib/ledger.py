"""The run ledger: every chapter run of a committed report, one JSON line each, appended and never rewritten.

``reports/ledger.jsonl`` records, per chapter run that ``studylib reproduce`` publishes into a committed
report folder: the chapter, profile, commit, whether the tree was dirty, the CPU model and its ISA path,
the load when the results were saved, the code fingerprint (``studylib.code_registration``) and each
decision row's and counted part's value, CI, n and verdict.

It is for display only and never feeds a verdict: a page shows the runs of its own code on its own CPU
model (``same_code``) and says where a verdict differed between them (``disagreements``). A rerun that
only relabels a page adds a line; it never replaces the earlier one, so a changed result cannot hide.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from studylib.code_registration import REPO_ROOT

LEDGER = REPO_ROOT / "reports" / "ledger.jsonl"


def entry(record: Mapping[str, Any]) -> dict[str, Any]:
    """The ledger line for one saved chapter record (``chNN.json`` as written, verdicts as dicts)."""
    prov = record.get("provenance") or {}
    fp = record.get("code_fingerprint") or {}
    rows = []
    for v in record.get("verdicts", []):
        v = v if isinstance(v, Mapping) else v.to_dict()
        if v.get("role") != "decision" and v.get("by_construction"):
            continue
        rows.append({k: v.get(k) for k in ("id", "role", "metric", "measured", "ci", "n", "unit", "verdict",
                                           "ci_method", "confidence")})
    return {"chapter": int(record.get("chapter", 0)), "profile": (record.get("params") or {}).get("profile"),
            "written": record.get("written"), "commit": str(prov.get("git_commit") or ""),
            "dirty": bool(prov.get("git_dirty")), "cpu": prov.get("cpu"),
            "isa": (prov.get("isa") or {}).get("label"), "load_average_1min": prov.get("load_average_1min"),
            "boot": prov.get("boot"), "code": fp.get("code"), "params": fp.get("params"), "rows": rows}


def append(record: Mapping[str, Any], path: str | Path | None = None) -> dict[str, Any]:
    """Append ``record``'s line to the ledger (created if absent) and return it."""
    path = Path(path or LEDGER)
    line = entry(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line, ensure_ascii=False, allow_nan=True) + "\n")
    return line


def read(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Every line, oldest first; a line that does not parse is skipped (the ledger is display-only)."""
    path = Path(path or LEDGER)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def same_code(entries: Iterable[Mapping[str, Any]], chapter: int, code: str | None, cpu: str | None,
              profile: str | None = None) -> list[Mapping[str, Any]]:
    """The runs of ``chapter`` with this code fingerprint on this CPU model and profile, oldest first: only
    these are shown together. A result without a profile (a toy study, a notebook run by hand) was never
    published into the ledger, so it matches none of its runs."""
    return [e for e in entries if e.get("chapter") == chapter and code and e.get("code") == code
            and e.get("cpu") == cpu and profile is not None and e.get("profile") == profile
            and not e.get("dirty")]


def decisions_by_run(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Per claim, the decision's verdict in each run, in run order."""
    out: dict[str, list[str]] = {}
    for r in runs:
        for row in r.get("rows", []):
            if row.get("role") == "decision":
                out.setdefault(row["id"], []).append(row["verdict"])
    return out


def disagreements(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The claims whose decision differed between ``runs`` (each with its verdicts in run order)."""
    return {cid: vs for cid, vs in decisions_by_run(runs).items() if len(set(vs)) > 1}


def summary(record: Mapping[str, Any], path: str | Path | None = None) -> str:
    """One sentence for a chapter page: how many committed runs of this code on this CPU the ledger holds,
    and where their verdicts differed (an empty string when it holds none)."""
    prov = record.get("provenance") or {}
    fp = record.get("code_fingerprint") or {}
    runs = same_code(read(path), int(record.get("chapter", 0)), fp.get("code"), prov.get("cpu"),
                     (record.get("params") or {}).get("profile"))
    if not runs:
        return ""
    differ = disagreements(runs)
    base = (f"The run ledger holds {len(runs)} run{'s' if len(runs) != 1 else ''} of this chapter's code on "
            f"{prov.get('cpu')}")
    if not differ:
        return base + (", and every one reached the same verdicts." if len(runs) > 1 else ".")
    cells = "; ".join(f"{cid}: {', '.join(vs)}" for cid, vs in differ.items())
    return base + f"; their verdicts differ between runs ({cells}), shown in run order."
