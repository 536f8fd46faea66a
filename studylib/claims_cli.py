"""``studylib claims``: the study's verdict table, read from the chapters' JSON files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="cpu", help="which reports to read: smoke | cpu | gpu (default: cpu)")
    p.add_argument("--dir", default=None, help="read chNN.json from this folder instead of reports/<profile>")
    p.add_argument("--json", action="store_true", help="print a JSON list of verdict objects")


def run(args: argparse.Namespace) -> int:
    from studylib.claims import chapter_files, load_verdicts, verdict_text
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
    else:
        print(verdict_text(verdicts))
    return 0
