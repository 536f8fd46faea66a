"""HTML for readers: a chapter page straight after its run, and the study's front page. Both come from
``studylib.workbook.book`` and ``studylib.workbook.front``; ``reproduce`` re-renders the whole book
(navigation between chapters, the printable page) once its chapters have run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def render_html(nb: Any | None, error: str | None = None, title: str = "chapter", dirty: bool = False) -> str:
    """One self-contained page of an executed notebook (setup cells hidden), with an error banner on top
    for a failed run (``nb`` may be None if execution never started) and a note when it was made from a
    dirty git tree."""
    from studylib.workbook.book import render_chapter

    return render_chapter(nb, None, [], 0, dirty=dirty, error=error, title=title)


def write_index(out: Path, index: Mapping[str, Any], notebooks: Mapping[int, Path]) -> Path:
    """``<out>/index.html``, the study's front page (``studylib.workbook.front``), rewritten after every
    chapter so that an interrupted run still leaves a correct one."""
    from studylib.workbook.front import write_front_page

    return write_front_page(out, index, None, notebooks)
