"""``studylib claims``: the study's verdict table, read from the chapters' JSON files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="cpu", help="which reports to read: smoke | cpu | gpu (default: cpu)")
    p.add_argument("--dir", default=None, help="read chNN.json from this folder instead of reports/<profile>")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print a JSON list of verdict objects")
    out.add_argument("--markdown", action="store_true",
                     help="print the Markdown summary (one line per claim, then every row), as in README")


def run(args: argparse.Namespace) -> int:
    from studylib.claims import chapter_files, load_verdicts, verdict_markdown, verdict_text
    from studylib.errors import StudylibError
    from studylib.workbook.paths import PROFILES, reports_dir

    if args.dir is None and args.profile not in PROFILES:
        raise StudylibError(f"unknown profile {args.profile!r}; choose one of {', '.join(PROFILES)}.")
    folder = Path(args.dir) if args.dir else reports_dir(args.profile)
    if not chapter_files(folder):
        raise StudylibError(f"no chapter results (chNN.json) in {folder}; run "
                            f"`studylib reproduce --profile {args.profile}` first.")
    verdicts = load_verdicts(folder)
    if args.json:
        print(json.dumps([v.to_dict() for v in verdicts], ensure_ascii=False, indent=1))
    elif args.markdown:
        print(verdict_markdown(verdicts), end="")
    else:
        print("The study, one line per claim:")
        print(study_summary(verdicts))
        print()
        print("Every chapter's rows:")
        print(verdict_text(verdicts))
    return 0


def study_summary(verdicts) -> str:
    """One line per claim (``study_decisions``): id, verdict, the deciding metric and its measured value,
    and the chapter(s) that decide it."""
    from studylib.claims import DECISION, format_measured, shown_metric, study_decisions

    lines = []
    for d in study_decisions(verdicts):
        chapters = sorted({v.chapter for v in verdicts if v.id == d.id and v.role == DECISION})
        where = "chapter" + ("s " if len(chapters) > 1 else " ") + ", ".join(map(str, chapters))
        lines.append(f"{d.id}  {d.verdict:<22}  {shown_metric(d)}: {format_measured(d.measured, d.ci, d.n)} ({where})")
    return "\n".join(lines)
