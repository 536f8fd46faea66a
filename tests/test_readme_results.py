"""README's results section is the study's verdict summary, generated, never typed by hand.

README.md holds, between the lines ``<!-- results:begin -->`` and ``<!-- results:end -->``, exactly
``verdict_markdown(load_verdicts("reports/cpu"))`` (what ``studylib claims --profile cpu --markdown``
prints). The first test checks that against the committed reports; the others check the Markdown and the
study-level line per claim on synthetic verdicts, and the ``claims`` command's output formats.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path

import pytest

from studylib.claims import (
    CONDITIONAL,
    DECISION,
    FAILS,
    HOLDS,
    PART,
    Verdict,
    decide_conditions,
    decide_parts,
    judge_at_least,
    judge_checks,
    load_verdicts,
    study_decisions,
    verdict_markdown,
)

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
NEW_FIELDS = ("n", "threshold", "direction", "role", "unit")
FIX = "regenerate it with `studylib claims --profile cpu --markdown` and paste it between the markers"


def _trim(text: str) -> list[str]:
    """The lines of ``text`` without the blank lines around them."""
    lines = text.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def readme_section(text: str) -> list[str]:
    """The trimmed lines between the results markers; an AssertionError that says what is wrong when the
    markers are missing, repeated or out of order."""
    lines = text.splitlines()
    begins = [i for i, s in enumerate(lines) if s.strip() == BEGIN]
    ends = [i for i, s in enumerate(lines) if s.strip() == END]
    assert len(begins) == 1 and len(ends) == 1, (
        f"README.md needs exactly one line {BEGIN!r} and one line {END!r} around the results section "
        f"(found {len(begins)} and {len(ends)}); {FIX}.")
    assert begins[0] < ends[0], f"README.md: {BEGIN!r} must come before {END!r}"
    return _trim("\n".join(lines[begins[0] + 1: ends[0]]))


def check_readme(root: Path) -> None:
    """Assert that ``root/README.md``'s results section is ``verdict_markdown`` of ``root/reports/cpu``."""
    reports = root / "reports" / "cpu"
    files = sorted(reports.glob("ch[0-9][0-9].json"))
    assert files, f"no chapter results in {reports}; run `studylib reproduce --profile cpu`"
    stale = []
    for f in files:
        for row in json.loads(f.read_text(encoding="utf-8")).get("verdicts", []):
            missing = [k for k in NEW_FIELDS if k not in row]
            if missing:
                stale.append(f"{f.name}: {row.get('id')} {row.get('metric')!r} lacks {', '.join(missing)}")
    assert not stale, ("reports/cpu were written before verdicts carried n/threshold/direction/role/unit; "
                       "regenerate them with `studylib reproduce --profile cpu`:\n" + "\n".join(stale))
    expected = _trim(verdict_markdown(load_verdicts(reports)))
    section = readme_section((root / "README.md").read_text(encoding="utf-8"))
    if section != expected:
        diff = "\n".join(difflib.unified_diff(section, expected, "README.md", "verdict_markdown", lineterm=""))
        raise AssertionError(f"README.md's results section differs from the reports; {FIX}.\n{diff}")


def test_readme_results_section_is_the_generated_summary():
    check_readme(ROOT)


def test_readme_section_extraction():
    text = f"# t\n\nintro\n{BEGIN}\n\n| a |\n|---|\n\n{END}\nmore\n"
    assert readme_section(text) == ["| a |", "|---|"]
    with pytest.raises(AssertionError, match="exactly one line"):
        readme_section("# no markers\n")
    with pytest.raises(AssertionError, match="exactly one line"):
        readme_section(f"{BEGIN}\nx\n{END}\n{BEGIN}\n")
    with pytest.raises(AssertionError, match="before"):
        readme_section(f"{END}\nx\n{BEGIN}\n")


# ------------------------------------------------------------------------- synthetic verdicts


def est(value, lo, hi, n=12):
    return (value, lo, hi, n)


def _c3_chapter(chapter: int, fast: bool) -> list[Verdict]:
    """C3 as a chapter decides it: exactness checks and a speed-up, taken as conditions."""
    exact = judge_checks("C3", "greedy output token-identical to AR", {"xsum": True, "chat": True}, "lossless", "",
                         chapter)
    speed = judge_at_least("C3", "wall-clock speedup | over AR", est(1.4, 1.2, 1.6) if fast else est(0.6, 0.5, 0.7),
                           1.0, "faster than AR", "", chapter)
    return decide_conditions("C3", "C3 in this chapter", [speed], "parallel decoding is faster", "", chapter,
                             names=["speed-up"]) + [dataclasses.replace(exact, role=PART)]


def _c6_chapter() -> list[Verdict]:
    cost = judge_at_least("C6", "speed-up over dense at 8k", est(3.4, 3.2, 3.6), 2.0, ">2x", "", 6)
    quality = judge_at_least("C6", "quality retained", est(0.998, 0.995, 0.999), 0.99, ">=0.99", "", 6)
    return decide_parts("C6", "sparse attention: cost and quality", [cost, quality], ">99% quality", "", 6)


def test_two_chapters_deciding_one_claim_give_one_study_line():
    ch2, ch3 = _c3_chapter(2, fast=True), _c3_chapter(3, fast=False)
    assert ch2[0].role == DECISION and ch2[0].verdict == HOLDS
    assert ch3[0].role == DECISION and ch3[0].verdict == FAILS
    lines = study_decisions([*ch2, *ch3])
    assert len(lines) == 1
    line = lines[0]
    assert line.id == "C3" and line.verdict == CONDITIONAL and line.chapter == 2
    assert "chapter 2" in line.conditions and "chapter 3 (does not hold)" in line.conditions
    # both chapters holding, or both failing, decide the claim outright
    assert study_decisions([*ch2, *_c3_chapter(3, fast=True)])[0].verdict == HOLDS
    assert study_decisions([*_c3_chapter(2, fast=False), *ch3])[0].verdict == FAILS


def test_markdown_has_a_study_table_then_every_row():
    # In chapter order, as load_verdicts returns them (the study line names the chapters in input order).
    verdicts = [*_c3_chapter(2, fast=True), *_c3_chapter(3, fast=False), *_c6_chapter()]
    md = verdict_markdown(verdicts)
    assert md.endswith("\n") and not md.endswith("\n\n")
    study, rows = md.split("\n\n")
    study_lines = study.splitlines()
    assert study_lines[:2] == ["| claim | verdict | decided by | chapter |", "|---|---|---|---|"]
    assert [s.split(" | ")[0] for s in study_lines[2:]] == ["| C3", "| C6"]  # one line per claim, in claim order
    assert study_lines[2] == "| C3 | **holds under conditions** | decision over chapters 2, 3: 1/2 hold | 2 |"
    assert study_lines[3] == "| C6 | **holds** | sparse attention: cost and quality: 2/2 parts hold | 6 |"
    row_lines = rows.splitlines()
    assert row_lines[0] == "| claim | chapter | row | metric | measured [95% CI unless marked] (n) | bar | verdict |"
    body = [[c.strip() for c in s.strip("|").split(" | ")] for s in row_lines[2:]]
    assert len(body) == len(verdicts)
    # by claim, then chapter, each decision before its parts
    assert [(r[0], r[1], r[2]) for r in body] == [
        ("C3", "2", "decision"), ("C3", "2", "part"), ("C3", "2", "part"),
        ("C3", "3", "decision"), ("C3", "3", "part"), ("C3", "3", "part"),
        ("C6", "6", "decision"), ("C6", "6", "part"), ("C6", "6", "part")]
    speed = next(s for s in row_lines if "wall-clock" in s and "| 2 |" in s)
    assert "wall-clock speedup \\| over AR" in speed  # a pipe in a cell is escaped
    assert "1.4 [1.2, 1.6] (n=12)" in speed and "≥ 1" in speed and speed.endswith("| holds |")
    assert "| all checks |" in next(s for s in row_lines if "token-identical" in s)


def _write_reports(folder: Path, verdicts: list[Verdict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for ch in sorted({v.chapter for v in verdicts}):
        rows = [v.to_dict() for v in verdicts if v.chapter == ch]
        (folder / f"ch{ch:02d}.json").write_text(json.dumps({"chapter": ch, "verdicts": rows}, ensure_ascii=False),
                                                 encoding="utf-8")


def test_markdown_survives_the_json_round_trip(tmp_path):
    verdicts = [*_c3_chapter(2, fast=True), *_c3_chapter(3, fast=False), *_c6_chapter()]
    _write_reports(tmp_path, verdicts)
    loaded = load_verdicts(tmp_path)
    assert verdict_markdown(loaded) == verdict_markdown(verdicts)


def test_claims_command_prints_markdown_and_the_study_lines_first(tmp_path, capsys):
    from studylib.cli import main

    verdicts = [*_c3_chapter(2, fast=True), *_c3_chapter(3, fast=False), *_c6_chapter()]
    _write_reports(tmp_path, verdicts)
    assert main(["claims", "--dir", str(tmp_path), "--markdown"]) == 0
    assert capsys.readouterr().out == verdict_markdown(load_verdicts(tmp_path))
    assert main(["claims", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    study, table = out.split("\n\n", 1)
    study_lines = study.splitlines()[1:]
    assert [s.split()[0] for s in study_lines] == ["C3", "C6"]
    assert CONDITIONAL in study_lines[0] and "chapters 2, 3" in study_lines[0]
    assert "chapter 6" in study_lines[1] and HOLDS in study_lines[1]
    assert "wall-clock speedup" in table and "quality retained" in table  # then the full table, parts included
    with pytest.raises(SystemExit):
        main(["claims", "--dir", str(tmp_path), "--markdown", "--json"])


def test_check_readme_on_a_synthetic_tree(tmp_path):
    _write_reports(tmp_path / "reports" / "cpu", [*_c3_chapter(2, fast=True), *_c6_chapter()])
    md = verdict_markdown(load_verdicts(tmp_path / "reports" / "cpu"))
    readme = tmp_path / "README.md"
    readme.write_text(f"# study\n\n## Results\n\n{BEGIN}\n\n{md}\n{END}\n\nmore text\n", encoding="utf-8")
    check_readme(tmp_path)
    readme.write_text(f"# study\n\n{BEGIN}\n{md.replace('**holds**', '**does not hold**', 1)}{END}\n",
                      encoding="utf-8")
    with pytest.raises(AssertionError, match="differs from the reports"):
        check_readme(tmp_path)
    readme.write_text("# study without markers\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="exactly one line"):
        check_readme(tmp_path)
    old = tmp_path / "reports" / "cpu" / "ch02.json"
    data = json.loads(old.read_text(encoding="utf-8"))
    for row in data["verdicts"]:
        del row["role"]
    old.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(AssertionError, match="lacks role"):
        check_readme(tmp_path)
