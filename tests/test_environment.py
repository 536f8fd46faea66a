"""The pinned environment: constraints.txt pins, exactly, everything pyproject.toml asks for."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert m, f"constraints.txt: {raw!r} is not an exact name==version pin"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = m.group(2)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


def test_constraints_pin_every_requirement_within_its_range():
    pins = _pins()
    assert "studylib" not in pins, "constraints.txt must not pin the project itself"
    assert pins.get("torch") == "2.13.0"
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is a dependency in pyproject.toml but not pinned in constraints.txt"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's {req}")


def test_makefile_installs_with_the_constraints():
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^\.venv/\.installed:.*\bconstraints\.txt\b", make, re.M)
    installs = [ln for ln in make.splitlines() if "pip install" in ln]
    assert installs and all("-c constraints.txt" in ln for ln in installs), installs
