"""What a wheel of studylib carries: every C, C++ and CUDA source a kernel builds from at run time."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_kernel_source_is_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    sources = [p for p in (ROOT / "studylib").rglob("csrc/*") if p.suffix in (".c", ".h", ".cpp", ".cu")]
    assert sources
    missing = []
    for src in sources:
        package = ".".join(src.parent.parent.relative_to(ROOT).parts)
        inner = src.relative_to(src.parent.parent).as_posix()
        if not any(fnmatch.fnmatch(inner, g) for g in data.get(package, [])):
            missing.append(f"{package}: {inner}")
    # a wheel without a kernel's source silently falls back to the slower path (or fails to build)
    assert not missing, missing
