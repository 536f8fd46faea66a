"""The book, assembled: every chapter page with its neighbours' links, the sweep pages, the front page and
the printable ``book.html``, from what a report folder holds. It runs nothing.

The flow runs one way: ``runner`` executes the chapters and writes their results; the page modules
(``book`` for a chapter page, ``front``, ``same_kind``, ``instrument``, ``why``, ``classroom``,
``studylib.sweep.page``) each render one kind of page or block from those results; this module, which
nothing below it imports, puts them together.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from studylib.claims import load_chapter
from studylib.sweep.page import sweep_dirs, write_sweep_page
from studylib.workbook import classroom, instrument, same_kind
from studylib.workbook.book import chapter_list, executed_notebooks, render_chapter, write_print_page
from studylib.workbook.front import write_front_page
from studylib.workbook.paths import atomic_write, read_index


def build_book(out: str | Path, index: Mapping[str, Any] | None = None) -> list[Path]:
    """Re-render every chapter page and the front page from what ``out`` holds; runs nothing."""
    out = Path(out)
    index = read_index(out) if index is None else index
    records = index.get("chapters", {})
    executed = executed_notebooks(out)
    chapters = chapter_list(out, executed)
    shared = same_kind.figures(out)  # read once for every page
    card = instrument.card(out, executed)
    notes = classroom.load()
    written = [instrument.write(out)] if card["lines"] else []
    for c, _ in chapters:
        nn = f"ch{c:02d}"
        data = load_chapter(out / f"{nn}.json") if (out / f"{nn}.json").exists() else None
        dirty = bool((records.get(str(c)) or {}).get("dirty_tree"))
        written.append(atomic_write(out / f"{nn}.html", render_chapter(executed[c], data, chapters, c, dirty=dirty,
                                                                      same_kind=same_kind.block(out, c, shared)
                                                                      + instrument.block(out, c, card),
                                                                      classroom=classroom.block(c, notes))))
    written += [write_sweep_page(d) for d in sweep_dirs(out)]
    written.append(write_front_page(out, index, chapters, executed=executed))
    written.append(write_print_page(out, chapters))
    return written


def book_defects(out: Path) -> dict[str, list[str]]:
    """Everything ``studylib book`` reports of a report folder: each page's text defects
    (``page_check.book_defects``) and, under "instrument card", every quantity the chapters print with two
    values under the same conditions and no stated reason (``instrument.compare``)."""
    from studylib.workbook.page_check import book_defects as page_defects

    found = page_defects(out)
    if any(Path(out).glob("ch[0-9][0-9].json")):
        card = instrument.card(out)["defects"]
        if card:
            found["instrument card"] = card
    return found
