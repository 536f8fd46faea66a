"""What git says about a file's history: which commit last changed each entry of it, and ancestry.

Registration is read from git (``studylib.decisions`` for the declarations, ``studylib.code_registration``
for the code): an entry is registered in the last commit that changed it, and a result counts only if
that commit is the result's own or an ancestor of it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
UNCOMMITTED = "uncommitted"


def git(*args: str, cwd: Path = REPO_ROOT) -> tuple[int, str]:
    """(exit status, stdout) of a git command; (1, "") when git cannot run."""
    try:
        p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
        return p.returncode, p.stdout
    except Exception:
        return 1, ""


def last_changed(path: Path, current: Mapping[str, Any], parse: Callable[[str], Mapping[str, Any]]) -> dict[str, str]:
    """Per key of ``current`` (the working copy's entries of ``path``), the commit where that entry last
    changed; ``UNCOMMITTED`` when it differs from HEAD's or the file is not committed. ``parse`` turns a
    committed version's text into its entries (a version that fails to parse has none)."""
    p = Path(path).resolve()
    rc, log = git("log", "--format=%H", "--", p.name, cwd=p.parent)
    history = [h for h in log.split() if h] if rc == 0 else []
    versions = []  # newest first: (commit, entries)
    for h in history:
        rc, old = git("show", f"{h}:./{p.name}", cwd=p.parent)
        try:
            versions.append((h, parse(old) if rc == 0 else {}))
        except Exception:
            versions.append((h, {}))
    out = {}
    for key, entry in current.items():
        if not versions or versions[0][1].get(key) != entry:
            out[key] = UNCOMMITTED
            continue
        reg = versions[0][0]
        for (_, newer), (h_old, older) in zip(versions, versions[1:], strict=False):
            if older.get(key) != newer.get(key):
                break
            reg = h_old
        out[key] = reg
    return out


def is_ancestor(older: str, newer: str, cwd: Path = REPO_ROOT) -> bool | None:
    """Whether commit ``older`` is ``newer`` or one of its ancestors; None when git cannot tell."""
    if not older or not newer or older == UNCOMMITTED or newer in ("unknown", ""):
        return False if older == UNCOMMITTED else None
    if older == newer:
        return True
    rc, _ = git("merge-base", "--is-ancestor", older, newer, cwd=cwd)
    if rc in (0, 1):
        return rc == 0
    return None
