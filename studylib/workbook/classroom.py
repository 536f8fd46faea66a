"""For the classroom: three takeaways and three discussion questions at the end of every chapter page.

They live in ``notebooks/classroom.yaml`` (one entry per chapter), so a teacher edits them without
touching a notebook, and a chapter's measuring code (which the registration fingerprints) never changes
for a word of teaching text. They name mechanisms and point at the page's numbers; they state none.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from studylib.code_registration import REPO_ROOT
from studylib.errors import StudylibError

CLASSROOM = REPO_ROOT / "notebooks" / "classroom.yaml"
EACH = 3


def load(path: str | Path | None = None) -> dict[int, dict[str, list[str]]]:
    """{chapter: {"takeaways": [...], "questions": [...]}}; a chapter without exactly three of each, or a
    file that does not parse, is refused with what to fix."""
    import yaml

    path = Path(path or CLASSROOM)
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise StudylibError(f"{path}: not valid YAML ({exc}); fix the file.") from None
    out, problems = {}, []
    if not isinstance(data, dict):
        raise StudylibError(f"{path}: expected one entry per chapter number; fix the file.")
    for ch, entry in data.items():
        if not isinstance(ch, int) or not isinstance(entry, dict):
            problems.append(f"{ch!r}: each key must be a chapter number holding takeaways and questions")
            continue
        for key in ("takeaways", "questions"):
            items = entry.get(key) or []
            if not isinstance(items, list) or len(items) != EACH or not all(isinstance(x, str) and x.strip()
                                                                             for x in items):
                got = len(items) if isinstance(items, list) else f"a {type(items).__name__}, not a list"
                problems.append(f"chapter {ch}: needs exactly {EACH} non-empty {key}, has {got}")
        out[ch] = {k: list(entry.get(k) or []) for k in ("takeaways", "questions")}
    if problems:
        raise StudylibError(f"{path}: " + "; ".join(problems) + ".")
    return out


def block(chapter: int, notes: Mapping[int, Mapping[str, Any]] | None = None) -> str:
    """The chapter's takeaways and questions as HTML ('' when the file has none for it)."""
    notes = load() if notes is None else notes
    entry = notes.get(int(chapter))
    if not entry:
        return ""
    take = "".join(f"<li>{html.escape(t)}</li>" for t in entry["takeaways"])
    ask = "".join(f"<li>{html.escape(q)}</li>" for q in entry["questions"])
    return (f"<div class='classroom'><h2>Takeaways</h2><ol>{take}</ol>"
            f"<h2>For discussion</h2><ol>{ask}</ol></div>")
