"""Registration that covers the code: hashes of everything that defines a chapter's metrics.

A declaration (``notebooks/params/decisions.yaml``) fixes the bars and rows; it does not fix how a number
is measured. An engine or a probe changed after registration changes the measurement, and a result
taken with it must not count as confirmatory. So each chapter's registration also records
(``notebooks/params/registered_code.json``, written by ``studylib register``):

- the SHA-256 of every Python module of ``studylib`` that the chapter's notebook imports, transitively
  (every ``import`` in a module's syntax tree, function-level imports included, so a lazy import counts,
  and every module named by a string, as ``importlib.import_module`` takes it);
  the presentation layers are left out (``studylib.workbook``, ``studylib.plots``, ``studylib.diagrams``
  and the chapters' ``*_figures`` modules), since they draw numbers and never make them;
- every C, C++ and CUDA source of the kernels (``studylib/**/csrc``); their build flags are written in
  the Python modules that compile them, which the first item hashes;
- the profile's parameters for the chapter (its ``common`` keys and its ``chNN`` section).

A chapter run records the same fingerprint (``save_chapter`` calls ``fingerprint``, with the parameters
the runner passed). ``studylib.decisions.apply_registration`` marks a decision exploratory when the
result's fingerprint differs from the registered one, when the registration's commit is not an
ancestor of the result's, or when the result carries no fingerprint: make the registration again
(``studylib register --profile cpu``, ``studylib.workbook.register_cli``), commit it, then run.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from studylib.git_history import UNCOMMITTED, is_ancestor, last_changed

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = REPO_ROOT / "studylib"
NOTEBOOKS = REPO_ROOT / "notebooks"
REGISTRY = NOTEBOOKS / "params" / "registered_code.json"
PARAMS_ENV = "STUDYLIB_RUN_PARAMS"  # the runner passes a chapter's effective parameters to its kernel here
PRESENTATION = ("studylib.workbook", "studylib.plots", "studylib.diagrams")
C_SUFFIXES = (".c", ".h", ".cu", ".cpp", ".cuh", ".hpp")
_MODULE_NAME = re.compile(r"studylib(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _is_presentation(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PRESENTATION) or module.endswith("_figures")


def module_file(module: str) -> Path | None:
    """The source file of ``studylib`` module ``module`` (a package's ``__init__.py``), None if none."""
    if module != "studylib" and not module.startswith("studylib."):
        return None
    parts = module.split(".")[1:]
    if not parts:
        return PACKAGE / "__init__.py"
    rel = Path(*parts)
    for cand in (PACKAGE / rel.with_suffix(".py"), PACKAGE / rel / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _imports(tree: ast.AST, package: str) -> set[str]:
    """Every module an AST imports: ``import a.b`` gives a.b and a; ``from a import b`` gives a and a.b
    (b may be a submodule); relative imports resolve against ``package``; a string constant spelled
    ``studylib.x.y`` names a module imported by name (``importlib``) and counts too."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            parts = base.split(".")
            out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
            out.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.fullmatch(node.value):
            # a module named by a string is imported later (importlib.import_module: the activation
            # kernels in quant.ACT_KERNELS, the registry in models.kernels, provenance's backends), so it
            # counts as an import; ``closure`` keeps only the names that are studylib modules
            out.add(node.value)
    return out


def closure(roots: Iterable[str]) -> list[str]:
    """The ``studylib`` modules reachable from ``roots`` through imports, presentation layers left out."""
    seen: set[str] = set()
    todo = [m for m in roots if module_file(m) is not None and not _is_presentation(m)]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        path = module_file(m)
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for dep in _imports(ast.parse(path.read_text(encoding="utf-8")), package):
            if dep not in seen and module_file(dep) is not None and not _is_presentation(dep):
                todo.append(dep)
    return sorted(seen)


def notebook_for(chapter: int) -> Path:
    hits = sorted(NOTEBOOKS.glob(f"{int(chapter):02d}_*.ipynb"))
    if not hits:
        from studylib.errors import StudylibError

        raise StudylibError(f"no notebook for chapter {chapter} in {NOTEBOOKS}")
    return hits[0]


def notebook_imports(notebook: Path) -> set[str]:
    """The modules a notebook's code cells import (cells that do not parse, e.g. magics, are skipped)."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    out: set[str] = set()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        try:
            out |= _imports(ast.parse("".join(cell.get("source", []))), "")
        except SyntaxError:
            continue
    return out


def kernel_sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in C_SUFFIXES and "csrc" in p.parts)


def params_digest(params: Mapping[str, Any]) -> str:
    """The parameters' hash, independent of key order; ``out_dir`` (where a run writes) is not one."""
    clean = {k: v for k, v in params.items() if k != "out_dir"}
    return _sha(json.dumps(clean, sort_keys=True, default=str).encode())


# Chapters whose results another chapter reads and judges on: chapter 7 takes chapter 5's throughput at
# saturation and latency under load (``ch07_system.serving_from_chapter5``), so the code that measured them
# (``ch05_load``, ``ch05_runs`` ...) defines chapter 7's metrics too and is hashed with it.
READS = {7: (5,)}


def fingerprint(chapter: int, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The chapter's code and parameters, hashed: ``files`` (path -> sha256 of each module and kernel
    source, the notebooks of the chapters it reads, ``READS``, included), ``code`` (one digest over them),
    ``params`` (the parameters' digest, None if not given)."""
    notebooks = [notebook_for(chapter)] + [notebook_for(c) for c in READS.get(int(chapter), ())]
    roots = set().union(*(notebook_imports(nb) for nb in notebooks))
    paths = [module_file(m) for m in closure(roots)] + kernel_sources() + notebooks
    files = {str(p.relative_to(REPO_ROOT)): _sha(p.read_bytes()) for p in paths}
    code = _sha(json.dumps(sorted(files.items())).encode())
    return {"code": code, "params": params_digest(params) if params is not None else None, "files": files}


def run_params() -> dict[str, Any] | None:
    """The parameters the runner passed to this kernel (``PARAMS_ENV``), None when run by hand."""
    text = os.environ.get(PARAMS_ENV)
    return json.loads(text) if text else None


def read_registry(path: Path | None = None) -> dict[str, Any]:
    path = path or REGISTRY
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def registered(profile: str, chapter: int, path: Path | None = None) -> dict[str, Any] | None:
    return read_registry(path).get(profile, {}).get(f"ch{int(chapter):02d}")


def differences(found: Mapping[str, Any], reg: Mapping[str, Any]) -> list[str]:
    """What differs between a run's fingerprint and its registration, in words (empty: nothing)."""
    out = []
    a, b = found.get("files", {}), reg.get("files", {})
    changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if changed:
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        out.append(f"code changed after registration ({shown})")
    elif found.get("code") != reg.get("code"):
        out.append("code changed after registration")
    if found.get("params") != reg.get("params"):
        out.append("parameters differ from the registered profile")
    return out


def stale(profile: str, chapter: int, params: Mapping[str, Any]) -> list[str]:
    """Why chapter ``chapter``, run now with ``params``, would not follow its registration under
    ``profile`` (empty: it would)."""
    reg = registered(profile, chapter)
    if reg is None:
        return [f"no code registration for profile {profile}"]
    return differences(fingerprint(chapter, params), reg)


def write(profile: str, params_by_chapter: Mapping[int, Mapping[str, Any]], path: Path | None = None) -> dict[str, Any]:
    """Write each chapter's fingerprint, with the parameters given for it, under ``profile`` in the
    registry (other chapters and profiles are kept)."""
    path = path or REGISTRY
    data = read_registry(path)
    section = data.setdefault(profile, {})
    for ch, params in sorted(params_by_chapter.items()):
        section[f"ch{int(ch):02d}"] = fingerprint(int(ch), params)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return data


def registration_commits(profile: str, path: Path | None = None) -> dict[str, str]:
    """Per chapter (``chNN``), the commit where its registration under ``profile`` last changed;
    ``"uncommitted"`` when the working copy's entry differs from HEAD's or the file is not committed."""
    p = (path or REGISTRY).resolve()

    def parse(text: str) -> dict[str, Any]:
        return json.loads(text).get(profile, {})

    return last_changed(p, read_registry(p).get(profile, {}), parse)


def check_result(data: Mapping[str, Any], path: Path | None = None) -> str:
    """Why a loaded chapter result does not follow its code registration ("" when it does)."""
    fp = data.get("code_fingerprint")
    profile = str((data.get("params") or {}).get("profile") or "")
    chapter = int(data.get("chapter", 0))
    if not fp:
        return "the result carries no code fingerprint (it predates registration of the code)"
    reg = registered(profile, chapter, path)
    if reg is None:
        return f"no code registration for profile {profile or '(none)'}"
    diff = differences(fp, reg)
    if diff:
        return "; ".join(diff)
    commit = registration_commits(profile, path).get(f"ch{chapter:02d}", UNCOMMITTED)
    if commit == UNCOMMITTED:
        return "its code registration has uncommitted changes"
    result = str((data.get("provenance") or {}).get("git_commit") or "").removesuffix("+dirty")
    if is_ancestor(commit, result) is False:
        return f"its code was registered in commit {commit[:12]}, after the result's commit {result[:12]}"
    return ""
