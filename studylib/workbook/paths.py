"""Where the workbook lives: notebooks, parameter profiles and reports, relative to the checkout."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROFILES = ("smoke", "class", "cpu", "gpu")


def repo_root() -> Path:
    """The checkout holding ``notebooks/`` (an editable install), else the current directory."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "notebooks").is_dir() else Path.cwd()


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


def params_dir() -> Path:
    return notebooks_dir() / "params"


def reports_dir(profile: str) -> Path:
    return repo_root() / "reports" / profile


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write to a temporary file beside ``path`` and rename it into place, so a reader (or a crash)
    never sees a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_index(out_dir: Path) -> dict:
    """A report folder's ``index.json`` (what ran, when, on which commit), or {} when there is none."""
    import json

    try:
        return json.loads((Path(out_dir) / "index.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def parameter_cells(notebook: Mapping[str, Any]) -> tuple[str, str]:
    """Where a notebook's parameters are: the source of its default parameters cell and of papermill's
    injected cell (empty where it has none)."""
    default = injected = ""
    for cell in notebook.get("cells", []):
        tags = cell.get("metadata", {}).get("tags", [])
        if "parameters" in tags:
            default = "".join(cell["source"])
        if "injected-parameters" in tags:
            injected = "".join(cell["source"])
    return default, injected
