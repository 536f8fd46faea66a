"""A sweep's spec: one YAML file naming a profile, chapters and a grid of parameter overrides.

    name: rows-by-size                   # required: letters, digits, - and _
    profile: cpu                         # required: notebooks/params/<profile>.yaml
    chapters: [1]                        # required: chapter numbers
    grid:                                # a product: every combination is a cell ...
      model: [random:smollm2-135m, random:llama3.2-1b]
    cells:                               # ... and/or an explicit list of cells
      - {model: random:smollm2-360m, rows_repeats: 3}
    params: {rows_repeats: 5}            # overrides every cell shares (a cell's own values win)
    resources: {num_cpus: 2, num_gpus: 0, memory_gb: 8}   # per cell, as Ray schedules it
    retries: 1                           # a failing cell runs again this many times, then is recorded failed
    out: reports/cpu/sweeps/rows-by-size # default: reports/<profile>/sweeps/<name>

A cell is one chapter with one set of overrides: (chapter, params). Its name is derived from the
chapter and the values that vary (its grid combination or list entry), so a spec edit that keeps a
cell keeps its name (and, with ``--resume``, its results when its key is unchanged).
Every problem is one line naming the key, the problem and the fix (``problems``)."""

from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studylib.errors import StudylibError

KEYS = {"name", "profile", "chapters", "grid", "cells", "params", "resources", "retries", "out", "description",
        "concurrency"}
RESOURCES = {"num_cpus", "num_gpus", "memory_gb"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


@dataclass
class Cell:
    chapter: int
    params: dict[str, Any]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = cell_name(self.chapter, self.params)


@dataclass
class SweepSpec:
    name: str
    profile: str
    chapters: list[int]
    grid: dict[str, list] = field(default_factory=dict)
    cells: list[dict] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=lambda: {"num_cpus": 1, "num_gpus": 0})
    retries: int = 0
    out: str | None = None
    description: str = ""
    path: str | None = None
    # Cells running at once (None: as many as the resources allow). A sweep that measures speed on one
    # machine wants 1: cells side by side share its memory bandwidth and caches, which Ray does not split.
    concurrency: int | None = None

    def expand(self) -> list[Cell]:
        """Every cell: each chapter with each grid combination, then each explicit cell (duplicates once)."""
        combos: list[dict] = []
        if self.grid:
            keys = list(self.grid)
            combos += [dict(zip(keys, values, strict=True)) for values in itertools.product(*self.grid.values())]
        combos += [dict(c) for c in self.cells]
        if not combos:
            combos = [{}]
        import hashlib
        import json

        out, seen = [], set()
        for ch in self.chapters:
            for c in combos:
                params = {**self.params, **c}
                key = (ch, json.dumps(params, sort_keys=True, default=str))
                if key in seen:  # the same chapter with the same parameters: one cell
                    continue
                seen.add(key)
                # named by what varies (the shared params would only repeat in every name)
                out.append(Cell(ch, params, cell_name(ch, c)))
        # Shortened values can make two different cells' names equal: those get their parameters' hash.
        names = [c.name for c in out]
        for c in out:
            if names.count(c.name) > 1:
                c.name = f"{c.name}-{hashlib.sha256(json.dumps(c.params, sort_keys=True, default=str).encode()).hexdigest()[:8]}"
        return out

    def out_dir(self, root: Path | None = None) -> Path:
        from studylib.workbook import paths

        if self.out:
            p = Path(self.out)
            return p if p.is_absolute() else (root or paths.repo_root()) / p
        return paths.reports_dir(self.profile) / "sweeps" / self.name


def _slug(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")[:40] or "x"


def cell_name(chapter: int, params: dict[str, Any]) -> str:
    """``chNN`` then ``key=value`` for each override, sorted: readable and stable."""
    parts = [f"ch{chapter:02d}", *(f"{k}={_slug(v)}" for k, v in sorted(params.items()))]
    return "-".join(parts)[:180]


def _suggest(key: str, options) -> str:
    close = difflib.get_close_matches(key, sorted(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def problems(raw: Any, where: str = "the spec") -> list[str]:
    """One line per problem in a spec's parsed YAML (empty: well-formed)."""
    if not isinstance(raw, dict):
        return [f"{where}: a sweep spec is a YAML mapping with name, profile, chapters and grid or cells"]
    out = []
    for k in sorted(set(raw) - KEYS):
        out.append(f"{where}: unknown key {k!r}{_suggest(k, KEYS)}; the keys are {', '.join(sorted(KEYS))}")
    for k in ("name", "profile", "chapters"):
        if k not in raw:
            out.append(f"{where}: {k} is missing; add it")
    name = raw.get("name")
    if "name" in raw and not (isinstance(name, str) and NAME_RE.match(name)):
        out.append(f"{where}: name {name!r} must be letters, digits, - and _ (it names the output folder)")
    if "profile" in raw and not isinstance(raw["profile"], str):
        out.append(f"{where}: profile must be a profile name such as cpu, smoke or gpu")
    ch = raw.get("chapters")
    if "chapters" in raw and not (isinstance(ch, list) and ch and all(isinstance(c, int) and not isinstance(c, bool)
                                                                      for c in ch)):
        out.append(f"{where}: chapters must be a non-empty list of chapter numbers, e.g. [1, 5]")
    grid = raw.get("grid", {})
    if not isinstance(grid, dict):
        out.append(f"{where}: grid must map parameter names to lists of values")
    elif any(not isinstance(k, str) for k in grid):
        out.append(f"{where}: grid keys must be parameter names (text), got {sorted(map(repr, grid))}")
    else:
        for k, v in grid.items():
            if not isinstance(v, list) or not v:
                out.append(f"{where}: grid.{k} must be a non-empty list of values (a single value goes in params)")
    cells = raw.get("cells", [])
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        out.append(f"{where}: cells must be a list of mappings of parameter overrides")
    elif any(not isinstance(k, str) for c in cells for k in c):
        out.append(f"{where}: cells' keys must be parameter names (text)")
    conc = raw.get("concurrency")
    if conc is not None and (not isinstance(conc, int) or isinstance(conc, bool) or conc < 1):
        out.append(f"{where}: concurrency must be an integer >= 1 (cells at once), got {conc!r}")
    if not isinstance(raw.get("params", {}), dict):
        out.append(f"{where}: params must map parameter names to values")
    res = raw.get("resources", {})
    if not isinstance(res, dict):
        out.append(f"{where}: resources must be a mapping with num_cpus, num_gpus, memory_gb")
    else:
        for k in sorted(set(res) - RESOURCES):
            out.append(f"{where}: resources.{k} is not a resource{_suggest(k, RESOURCES)}; use num_cpus, num_gpus, "
                       "memory_gb")
        for k in RESOURCES & set(res):
            if not isinstance(res[k], int | float) or isinstance(res[k], bool) or res[k] < 0:
                out.append(f"{where}: resources.{k} must be a number >= 0, got {res[k]!r}")
    r = raw.get("retries", 0)
    if not isinstance(r, int) or isinstance(r, bool) or r < 0:
        out.append(f"{where}: retries must be an integer >= 0, got {r!r}")
    if "out" in raw and not isinstance(raw["out"], str):
        out.append(f"{where}: out must be a folder path")
    return out


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a spec file; a malformed one is a StudylibError listing every problem, one a line."""
    import yaml

    p = Path(path)
    if not p.exists():
        raise StudylibError(f"no sweep spec at {p}; give the path of a YAML file (see `studylib sweep --help`).")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise StudylibError(f"{p}: not valid YAML: {str(err).splitlines()[0]}") from None
    bad = problems(raw, str(p))
    if bad:
        raise StudylibError("\n".join(bad))
    res = {"num_cpus": 1, "num_gpus": 0, **raw.get("resources", {})}
    return SweepSpec(name=raw["name"], profile=raw["profile"], chapters=list(raw["chapters"]),
                     grid=dict(raw.get("grid", {})), cells=list(raw.get("cells", [])), params=dict(raw.get("params", {})),
                     resources=res, retries=int(raw.get("retries", 0)), out=raw.get("out"),
                     description=str(raw.get("description", "")), path=str(p), concurrency=raw.get("concurrency"))
