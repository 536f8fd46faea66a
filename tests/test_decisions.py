"""Decisions declared before the run: the committed declarations parse and cover the cpu profile, rows are
judged only as declared, and a result that predates its declaration's last change is exploratory."""

import subprocess

import pytest
import yaml

from studylib import decisions
from studylib.claims import (
    CLAIMS,
    HOLDS,
    INCONCLUSIVE,
    decide_parts,
    judge_at_least,
    judge_checks,
)
from studylib.errors import StudylibError

DECL = """
C1@1:
  decides: toy
  rule: parts
  rows:
    - {match: "^speed", bar: 2.0, direction: at_least, unit: prompts, min_n: 10, source: study}
    - {match: "^identical", direction: check, unit: prompts, min_n: 10, by_construction: true}
"""


def _rows(bar=2.0, by_construction=True):
    speed = judge_at_least("C1", "speed of x", (3.0, 2.5, 3.5, 10), bar, "", "", 1)
    same = judge_checks("C1", "identical to x", {f"p{i}": True for i in range(10)}, "", "", 1, unit="prompts",
                        by_construction=by_construction)
    return decide_parts("C1", "toy decision", [speed, same], "", "", 1)


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    path = tmp_path / "decisions.yaml"
    path.write_text(DECL)
    first = _git(tmp_path, "add", "decisions.yaml") and _git(tmp_path, "commit", "-qm", "declare")
    return tmp_path, path, first


def test_committed_declarations_parse_and_name_known_claims():
    decls = decisions.load()
    assert decls and all(d.claim in CLAIMS for d in decls.values())
    # every claim the study decides is declared in at least one chapter
    assert {d.claim for d in decls.values()} == set(CLAIMS)


def test_cpu_profile_runs_the_declared_configurations():
    params = yaml.safe_load(open(decisions.REPO_ROOT / "notebooks" / "params" / "cpu.yaml"))
    assert list(params["ch06"]["doc_patterns"]) == list(decisions.declared("C6", 6).configurations)
    lossy = decisions.declared("C9", 8).configurations
    assert set(lossy) <= set(params["ch08"]["arms"])
    assert params["ch03"]["headline"] in decisions.declared("C3", 3).configurations


def test_stamp_accepts_declared_rows_and_refuses_others(repo):
    _, path, first = repo
    rows = decisions.stamp(_rows(), 1, path)
    assert all(r.registered_in == first for r in rows)
    with pytest.raises(StudylibError, match="judged at bar 1.5, declared 2.0"):
        decisions.stamp(_rows(bar=1.5), 1, path)
    with pytest.raises(StudylibError, match="by_construction=False, declared True"):
        decisions.stamp(_rows(by_construction=False), 1, path)
    stray = judge_at_least("C1", "latency", (3.0, 2.5, 3.5, 10), 2.0, "", "", 1)
    with pytest.raises(StudylibError, match="matches no declared row"):
        decisions.stamp([*_rows(), stray], 1, path)
    with pytest.raises(StudylibError, match="C2@1 is not declared"):
        decisions.stamp([judge_at_least("C2", "speed", (3.0, 2.5, 3.5, 10), 2.0, "", "", 1)], 1, path)


def test_bad_declarations_name_each_problem(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("C1@1:\n  rule: sometimes\n  rows:\n    - {match: '(', unit: prompts}\nCX@2: {}\n")
    with pytest.raises(StudylibError) as err:
        decisions.load(path)
    text = str(err.value)
    assert "rule must be" in text and "valid 'match'" in text and "CX@2" in text


def _record(rows, commit, dirty=False):
    return {"verdicts": list(rows), "provenance": {"git_commit": commit, "git_dirty": dirty}}


def test_a_result_after_its_declaration_is_confirmatory(repo):
    cwd, path, first = repo
    (cwd / "code.py").write_text("x = 1\n")
    result_commit = _git(cwd, "add", "code.py") and _git(cwd, "commit", "-qm", "code")
    rows = decisions.stamp(_rows(), 1, path)
    out = decisions.apply_registration(_record(rows, result_commit), path)["verdicts"]
    assert out[0].verdict == HOLDS and not out[0].exploratory


def test_a_declaration_changed_after_the_result_makes_it_exploratory(repo):
    cwd, path, first = repo
    rows = decisions.stamp(_rows(), 1, path)  # the result of commit `first`
    path.write_text(DECL.replace("bar: 2.0", "bar: 1.5"))
    # uncommitted change: exploratory at once
    out = decisions.apply_registration(_record(rows, first), path)["verdicts"]
    assert out[0].exploratory and out[0].verdict == INCONCLUSIVE and "uncommitted" in out[0].conditions
    later = _git(cwd, "commit", "-qam", "lower the bar")
    out = decisions.apply_registration(_record(rows, first), path)["verdicts"]
    assert out[0].exploratory and out[0].verdict == INCONCLUSIVE
    assert later[:12] in out[0].conditions and "it read 'holds'" in out[0].conditions
    # the parts keep their own verdicts; only the decision is capped
    assert out[1].verdict == HOLDS
    # a rerun from the new commit is confirmatory again
    rows = decisions.stamp(_rows(bar=1.5), 1, path)
    assert decisions.apply_registration(_record(rows, later), path)["verdicts"][0].verdict == HOLDS


def test_dirty_or_undeclared_results_are_exploratory(repo):
    _, path, first = repo
    rows = decisions.stamp(_rows(), 1, path)
    assert decisions.apply_registration(_record(rows, first, dirty=True), path)["verdicts"][0].exploratory
    old = [r.__class__(**{**r.__dict__, "registered_in": None}) for r in rows]  # a result from before declarations
    v = decisions.apply_registration(_record(old, first), path)["verdicts"][0]
    assert v.exploratory and "predates" in v.conditions
    # a decision that did not hold stays as it was: exploratory only caps a positive verdict
    failing = decide_parts("C1", "toy", [judge_at_least("C1", "speed", (1.0, 0.9, 1.1, 10), 2.0, "", "", 1)],
                           "", "", 1)
    failing = decisions.stamp(failing, 1, path)
    path.write_text(DECL + "\n")  # same entries: nothing changed for C1@1
    assert not decisions.apply_registration(_record(failing, first), path)["verdicts"][0].exploratory


def test_every_bar_says_where_it_comes_from(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("C1@1:\n  rows:\n    - {match: '^a', bar: 2.0, direction: at_least}\n"
                    "    - {match: '^b', direction: check, source: essay}\n")
    with pytest.raises(StudylibError) as err:
        decisions.load(path)
    assert "row 0 has a bar; say where it comes from" in str(err.value) and "row 1 names a source" in str(err.value)
    path.write_text("C1@1:\n  rows:\n    - {match: '^a', bar: 2.0, direction: at_least, source: essay}\n")
    row = judge_at_least("C1", "a metric", (2.5, 2.1, 2.9, 10), 2.0, ">= 2", "toy", 1)
    assert decisions.bar_origin(row, path) == "the essay's number"
    assert decisions.bar_origin(judge_at_least("C2", "a", (1, 1, 1, 10), 2.0, "", "", 1), path) is None


def test_writing_down_a_bars_source_or_a_note_later_reregisters_nothing(tmp_path):
    """Where a bar comes from and the prose beside it decide nothing: adding them after a result keeps the
    result confirmatory. Changing the bar itself does not (the test above)."""
    _git(tmp_path, "init", "-q")
    path = tmp_path / "decisions.yaml"
    path.write_text(DECL.replace(", source: study", ""))
    first = _git(tmp_path, "add", "decisions.yaml") and _git(tmp_path, "commit", "-qm", "declare")
    path.write_text(DECL + "  notes: study's choice, said later\n")
    _git(tmp_path, "commit", "-qam", "say where the bar comes from")
    rows = decisions.stamp(_rows(), 1, path)
    out = decisions.apply_registration(_record(rows, first), path)["verdicts"]
    assert out[0].verdict == HOLDS and not out[0].exploratory
    assert decisions.registrations(path)["C1@1"] == first
