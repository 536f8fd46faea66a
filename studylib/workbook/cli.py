"""``studylib reproduce``: execute chapter notebooks with a parameter profile and render the reports."""

from __future__ import annotations

import argparse

from studylib.workbook.paths import PROFILES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="cpu", help=f"parameter profile: {' | '.join(PROFILES)} (default: cpu)")
    p.add_argument("--chapters", default=None, help="which chapters, e.g. 1,2 or 1-3 (default: all)")
    p.add_argument("--out", default=None, help="report folder (default: reports/<profile>)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a notebook parameter, e.g. -p model=<hf-id-or-path> -p device=cuda (repeatable)")
    p.add_argument("--resume", action="store_true",
                   help="skip chapters whose report is newer than the notebook, the profile and the sources")
    p.add_argument("--notebooks", default=None, help="folder of NN_name.ipynb chapters (default: notebooks/)")
    p.add_argument("--cell-timeout", type=float, default=None, help="fail a cell that runs longer (seconds)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--dry-run", action="store_true",
                   help="run nothing: check every profile key and -p override against the notebooks' parameters "
                        "(names and types), inject them with papermill, resolve the models and patterns, and check "
                        "CUDA-only settings stop with a clear message here; exit 0, or 2 with one line per problem")
    p.add_argument("--allow-dirty", action="store_true",
                   help="write the committed reports/<profile> folder even with uncommitted changes to tracked "
                        "files; every page is then marked as made from a dirty tree")


def run(args: argparse.Namespace) -> int:
    from studylib.workbook.runner import FAILED, parse_chapters, parse_overrides, reproduce

    if args.dry_run:
        return _dry_run(args)

    runs = reproduce(profile=args.profile, chapters=parse_chapters(args.chapters), out_dir=args.out,
                     overrides=parse_overrides(args.param), resume=args.resume, notebooks_dir=args.notebooks,
                     progress=not args.no_progress, cell_timeout=args.cell_timeout,
                     allow_dirty=args.allow_dirty)
    failed = [r for r in runs if r.status == FAILED]
    for r in failed:
        print(f"studylib: chapter {r.chapter} failed: {r.error}")
    return 1 if failed else 0


def _dry_run(args: argparse.Namespace) -> int:
    import sys

    from studylib.workbook.dry_run import cuda_settings, dry_run
    from studylib.workbook.runner import parse_chapters, parse_overrides

    chapters = parse_chapters(args.chapters)
    problems = dry_run(args.profile, chapters, parse_overrides(args.param), args.notebooks)
    for line in problems:
        print(f"studylib: {line}", file=sys.stderr)
    if problems:
        return 2
    cuda = cuda_settings(args.profile)
    print(f"dry run of profile {args.profile}: every parameter exists in its notebook with a compatible type, "
          "models and attention patterns resolve" + (f"; CUDA-only settings ({len(cuda)}) stop with a clear "
          "message on a machine without CUDA" if cuda else "") + ". Nothing was run.")
    return 0
