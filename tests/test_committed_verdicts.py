"""The committed study follows the rules that keep its verdicts from flipping on the next run (issue 43).

Read from ``reports/cpu`` as committed: if a chapter is rerun in a way that brings back a deciding number
over the prompts of one process, a result that does not follow its code registration, or a ledger that
lost a run, these fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studylib.claims import DECISION, load_chapter
from studylib.verdict import MIN_UNITS, RUN_CI

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports" / "cpu"
CHAPTERS = sorted(REPORTS.glob("ch[0-9][0-9].json"))
SPEED = ("speed-up", "speedup", "throughput", "fraction of memory bandwidth", "scales with the bytes read")


def _rows(path):
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_deciding_machine_level_number_rests_on_whole_runs(path):
    data = _rows(path)
    for v in data["verdicts"]:
        machine = any(w in v["metric"] for w in SPEED) and v.get("direction") == "at_least"
        if not machine or v.get("by_construction") or v["id"] == "C7" and "under load" in v["metric"]:
            continue
        assert v["unit"] == "whole runs", f"{path.name}: {v['metric']!r} is decided over {v['unit']}, not whole runs"
        if v.get("ci") is not None:
            assert (v.get("ci_method") or "").startswith(RUN_CI), f"{path.name}: {v['metric']!r}: {v.get('ci_method')}"
            assert v["n"] >= MIN_UNITS["whole runs"], f"{path.name}: {v['metric']!r} rests on {v['n']} runs"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_committed_result_carries_the_registered_fingerprint(path):
    from studylib.code_registration import differences, registered

    raw = _rows(path)
    fp = raw.get("code_fingerprint")
    assert fp, f"{path.name} carries no code fingerprint; rerun it with `make reproduce`"
    reg = registered(raw["params"]["profile"], raw["chapter"])
    assert reg is not None and differences(fp, reg) == [], f"{path.name}: {differences(fp, reg or {})}"
    # a decision that does not follow its registration says so and cannot read "holds"
    for v in load_chapter(path)["verdicts"]:
        if v.role == DECISION and v.exploratory:
            assert v.verdict not in ("holds", "holds under conditions") and "exploratory:" in v.conditions


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_bootstrap_cis_report_their_monte_carlo_error(path):
    for v in _rows(path)["verdicts"]:
        if (v.get("ci_method") or "").startswith("BCa"):
            assert v.get("mc_error") is not None, f"{path.name}: {v['metric']!r}"


def test_the_ledger_holds_every_committed_chapter_run():
    from studylib import ledger

    lines = ledger.read()
    for path in CHAPTERS:
        data = _rows(path)
        commit = data["provenance"]["git_commit"]
        hits = [e for e in lines if e["chapter"] == data["chapter"] and e["commit"] == commit
                and e["code"] == data["code_fingerprint"]["code"]]
        assert hits, f"reports/ledger.jsonl has no line for {path.name} (commit {commit[:12]})"


def test_the_committed_run_is_what_the_readme_says_it_is():
    """The README calls the committed study one ``make reproduce`` on a clean tree: every chapter then names
    one commit, none was made from a dirty tree, and each started after the one before it finished (a
    chapter rerun apart, as chapters 5 and 7 once were, breaks the order or the commit)."""
    import datetime as dt

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    if "one `make reproduce`" not in readme:
        pytest.skip("the README makes no claim about how the committed study was run")
    index = json.loads((REPORTS / "index.json").read_text(encoding="utf-8"))["chapters"]
    commits = {p.stem: _rows(p)["provenance"]["git_commit"] for p in CHAPTERS}
    assert len(set(commits.values())) == 1, f"chapters made at different commits: {commits}"
    assert not [k for k, r in index.items() if r.get("dirty_tree")], "a chapter was started from a dirty tree"
    dirty = [p.stem for p in CHAPTERS if _rows(p)["provenance"].get("git_dirty")]
    assert not dirty, f"the tree changed while these chapters ran (dirty when they saved): {dirty}"
    spans = []
    for k, r in sorted(index.items(), key=lambda kv: int(kv[0])):
        end = dt.datetime.fromisoformat(r["finished"])
        spans.append((int(k), end - dt.timedelta(seconds=float(r["seconds"])), end))
    for (a, _, end_a), (b, start_b, _) in zip(spans, spans[1:], strict=False):
        # papermill's own start-up sits outside a chapter's seconds: a few seconds of slack, not minutes
        assert start_b >= end_a - dt.timedelta(seconds=5), f"chapter {b} started before chapter {a} finished"
        assert start_b - end_a < dt.timedelta(minutes=5), f"chapter {b} ran {start_b - end_a} after chapter {a}"


def test_the_readme_names_every_commit_the_committed_chapters_were_made_at():
    """However the committed study was run, the README says at which commits: a chapter rerun apart cannot
    hide behind a sentence about one run."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commits = {_rows(p)["provenance"]["git_commit"][:12] for p in CHAPTERS}
    missing = sorted(c for c in commits if c not in readme)
    assert not missing, f"the README does not name the commits {missing} that made the committed chapters"
