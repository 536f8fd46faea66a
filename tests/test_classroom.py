"""Takeaways and discussion questions: every chapter has three of each, and a bad file is refused."""

from __future__ import annotations

import pytest

from studylib.errors import StudylibError
from studylib.workbook import classroom


def test_every_chapter_has_three_takeaways_and_three_questions():
    notes = classroom.load()
    assert sorted(notes) == list(range(1, 9))
    assert all(len(n["takeaways"]) == 3 and len(n["questions"]) == 3 for n in notes.values())
    html = classroom.block(5, notes)
    assert "<h2>Takeaways</h2>" in html and "<h2>For discussion</h2>" in html and html.count("<li>") == 6
    assert classroom.block(99, notes) == ""


def test_a_chapter_with_two_questions_is_refused_by_name(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("3:\n  takeaways: [a, b, c]\n  questions: [a, b]\n")
    with pytest.raises(StudylibError, match="chapter 3: needs exactly 3 non-empty questions, has 2"):
        classroom.load(bad)


def test_teaching_text_is_escaped_and_a_string_is_not_three_items(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("1:\n  takeaways: [a<b, c, d]\n  questions: [e, f, g]\n")
    assert "a&lt;b" in classroom.block(1, classroom.load(f))
    f.write_text("1:\n  takeaways: abc\n  questions: [e, f, g]\n")
    with pytest.raises(StudylibError, match="has a str, not a list"):
        classroom.load(f)
