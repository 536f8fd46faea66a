"""``studylib book``: re-render the study's pages (front page, chapters, the printable page) from the
executed notebooks and JSON a run left in ``reports/<profile>``; runs no chapter."""

from __future__ import annotations

import argparse
from pathlib import Path

from studylib.errors import StudylibError
from studylib.workbook.paths import PROFILES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="cpu", help=f"which report folder: {' | '.join(PROFILES)} (default: cpu)")
    p.add_argument("--out", default=None, help="report folder (default: reports/<profile>)")
    p.add_argument("--pdf", action="store_true", help="also print book.html to book.pdf with headless Chromium")
    p.add_argument("--chromium", default=None, help="the Chromium executable for --pdf (default: found on PATH)")


def run(args: argparse.Namespace) -> int:
    from studylib.workbook import paths
    from studylib.workbook.assemble import build_book
    from studylib.workbook.book import print_pdf

    out = Path(args.out) if args.out else paths.reports_dir(args.profile)
    if not any(out.glob("ch[0-9][0-9].ipynb")):
        raise StudylibError(f"no executed chapter (chNN.ipynb) in {out}; run `studylib reproduce --profile "
                            f"{args.profile}` first, or pass --out to the folder a run wrote.")
    written = build_book(out)
    if args.pdf:
        from studylib.workbook.front import write_front_page
        from studylib.workbook.paths import read_index

        written.append(print_pdf(out, args.chromium))
        write_front_page(out, read_index(out))  # again, now that there is a book.pdf to link
    print(f"wrote {len(written)} pages into {out} (open {out / 'index.html'})")
    import sys

    from studylib.workbook.assemble import book_defects

    for page, defects in book_defects(out).items():  # a warning: the pages are written either way
        for d in defects:
            print(f"{page}: {d}", file=sys.stderr)
    return 0
