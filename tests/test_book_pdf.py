"""The committed book.pdf is the one a class prints: at most 60 pages, no code cell, and every table header
of the printed page present and whole in its text (a header broken mid-word, or a column lost off the
page, is not found). It reads the committed files, so it needs a PDF reader but no browser; under CI a
missing reader fails rather than skips."""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "reports" / "cpu"
MAX_PAGES = 60


def _reader():
    try:
        import pypdf
    except ImportError:
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail("pypdf is missing under CI: install the test extras (constraints.txt pins it)")
        pytest.skip("pypdf is not installed")
    if not (BOOK / "book.pdf").exists():
        pytest.skip("no committed book.pdf")
    return pypdf.PdfReader(str(BOOK / "book.pdf"))


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _printed(page: str) -> str:
    """book.html without what a printed page does not show: folded <details> (the appendix of settings, the
    published values) and the every-verdict table, which the printed front matter carries in its compact form."""
    page = re.sub(r"<details(?![^>]*\bopen\b)[^>]*>.*?</details>", "", page, flags=re.S)
    page = re.sub(r"<details class='all'.*?</details>", "", page, flags=re.S)
    return re.sub(r"<style.*?</style>|<script.*?</script>", "", page, flags=re.S)


def _printed_headers(page: str) -> list[str]:
    """The <th> texts of book.html that print."""
    page = _printed(page)
    heads = [html.unescape(re.sub(r"<[^>]+>", "", h)).strip()
             for h in re.findall(r"<th\b[^>]*>(.*?)</th>", page, flags=re.S)]
    return [h for h in heads if h]


def test_the_printed_book_is_short_enough_to_print_for_a_class():
    assert len(_reader().pages) <= MAX_PAGES


def _printed_cells(page: str) -> list[str]:
    page = _printed(page)
    return [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td\b[^>]*>(.*?)</td>", page,
                                                                               flags=re.S)]


def test_the_printed_book_shows_no_code_and_every_table_header_whole():
    raw = " ".join(p.extract_text() or "" for p in _reader().pages)
    text, tokens = _squash(raw), set(raw.split())
    page = (BOOK / "book.html").read_text(encoding="utf-8")
    code = re.findall(r"class=[\"'][^\"']*\b(?:input_area|jp-InputArea)\b", page)
    assert not code, f"{len(code)} code cells are in the printed book"
    missing = sorted({h for h in _printed_headers(page) if _squash(h) not in text})
    assert not missing, f"{len(missing)} table headers are not found whole in book.pdf's text: {missing[:12]}"
    # each word of a header is one word of the text: a header broken mid-word ("Weig ht") is not
    broken = sorted({w for h in _printed_headers(page) for w in h.split() if w not in tokens})
    assert not broken, f"{len(broken)} header words print broken or lost: {broken[:12]}"


def test_the_printed_book_breaks_no_number_in_its_tables():
    """Every decimal number of a printed table cell is one word of book.pdf's text: a number wrapped inside
    ("0.89 9"), or a column lost off the page, is not found."""
    tokens = set(" ".join(p.extract_text() or "" for p in _reader().pages).split())
    page = (BOOK / "book.html").read_text(encoding="utf-8")
    numbers = {w for c in _printed_cells(page) for w in c.split() if re.fullmatch(r"[\[(]?-?\d+\.\d+[\]),x%]*", w)}
    assert numbers, "no number in the printed tables: the check reads nothing"
    broken = sorted(w for w in numbers if w not in tokens)
    assert not broken, f"{len(broken)} table numbers print broken or lost: {broken[:12]}"


def test_the_printed_book_shows_every_exercise_command_whole():
    """A command printed past the page's right edge is lost ("-p dtype=bfl"): each exercise command of
    book.html is found whole in book.pdf's text (wrapping inside it is allowed; squashed, it reads the same)."""
    text = _squash(" ".join(p.extract_text() or "" for p in _reader().pages))
    page = _printed((BOOK / "book.html").read_text(encoding="utf-8"))
    commands = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<pre[^>]*>(.*?)</pre>", page, flags=re.S)]
    lines = [ln.strip() for c in commands for ln in c.splitlines() if "studylib reproduce" in ln]
    assert lines, "book.html prints no exercise command"
    cut = [ln for ln in lines if _squash(ln) not in text]
    assert not cut, f"{len(cut)} exercise commands do not print whole, e.g. {cut[:2]}"
