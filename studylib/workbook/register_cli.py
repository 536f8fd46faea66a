"""``studylib register``: record, before a run, the hashes of the code and parameters each chapter
measures with (``studylib.code_registration``); ``--check`` says which chapters differ from theirs.

Commit the registry (``notebooks/params/registered_code.json``) before ``make reproduce``: a result
whose code or parameters differ from the registration, or whose registration came after it, is
exploratory."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from studylib import code_registration as cr
from studylib.workbook.runner import (
    chapter_parameters,
    declared_parameters,
    discover,
    load_profile,
    parse_chapters,
)


def profile_params(profile: str, chapters: Iterable[int] | None = None) -> dict[int, dict[str, Any]]:
    """Each chapter's parameters under ``profile``, as ``studylib reproduce`` passes them (no overrides)."""
    notebooks = discover(cr.NOTEBOOKS)
    cfg = load_profile(profile, cr.NOTEBOOKS / "params")
    return {c: chapter_parameters(cfg, c, declared_parameters(notebooks[c]), {}, profile)
            for c in sorted(chapters or notebooks)}


def stale_chapters(profile: str, chapters: Iterable[int] | None = None) -> dict[int, list[str]]:
    """Chapters whose current code or parameters differ from their registration (or have none)."""
    reasons = {c: cr.stale(profile, c, params) for c, params in profile_params(profile, chapters).items()}
    return {c: why for c, why in reasons.items() if why}


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="cpu", help="the profile whose parameters are registered (default cpu)")
    parser.add_argument("--chapters", default=None, help="comma-separated chapters (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="only say which chapters' code or parameters differ from their registration (exit 1 if any)")


def run(args) -> int:
    chapters = parse_chapters(args.chapters)
    if args.check:
        stale = stale_chapters(args.profile, chapters)
        for c, why in stale.items():
            print(f"chapter {c}: {'; '.join(why)}")
        if not stale:
            print(f"every chapter's code and parameters match their registration for profile {args.profile}")
        return 1 if stale else 0
    params = profile_params(args.profile, chapters)
    cr.write(args.profile, params)
    print(f"registered the code of chapters {', '.join(str(c) for c in params)} for profile {args.profile} in "
          f"{cr.REGISTRY.relative_to(cr.REPO_ROOT)}; commit it before the run.")
    return 0
