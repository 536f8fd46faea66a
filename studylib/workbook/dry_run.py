"""``studylib reproduce --dry-run``: check a profile against the notebooks without running a chapter.

For each chosen chapter: every key the profile (and each ``-p`` override) sets must exist in the
notebook's parameters cell, with a value of a compatible type (the default's); papermill injects them
in prepare-only mode and the injected cell must execute; model specs must resolve (without loading
weights); attention patterns must parse; and every CUDA-only setting (a cuda device, float16, the
triton / cuda attention backends) must, on a machine without CUDA, stop with the library's own clear
message rather than crash somewhere inside a chapter. The result is a list of problems, one line each
(empty: the profile would start on this machine, or on a GPU machine for CUDA settings).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studylib.errors import StudylibError
from studylib.workbook.paths import parameter_cells


def _compatible(default: Any, value: Any) -> bool:
    """Whether ``value`` can stand where the notebook's default ``default`` stands."""
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, list | tuple):
        if not isinstance(value, list | tuple):
            return False
        kinds = {type(d) for d in default}
        if len(kinds) == 1 and default:  # a homogeneous default list: each element must fit its type
            return all(_compatible(default[0], v) for v in value)
        return True
    if isinstance(default, dict):
        return isinstance(value, dict)
    return True


def _type_name(v: Any) -> str:
    name = type(v).__name__
    return ("an " if name[0] in "aeiou" else "a ") + name


def _check_model(spec: Any) -> str | None:
    """None if ``spec`` names a model this runtime can load here (no weights are read), else why not."""
    from studylib.models import check_model

    if not isinstance(spec, str):
        return f"is {spec!r}, not a model name"
    try:
        check_model(spec)
    except StudylibError as err:
        return str(err).rstrip(".")
    return None


def _cuda_guard(key: str, value: Any) -> str | None:
    """For a CUDA-only setting on a machine without CUDA: None if the library stops it with its own clear
    message (StudylibError), else a description of what would happen instead."""
    import torch

    from studylib.models import resolve_device, resolve_dtype

    try:
        if key == "device":
            resolve_device(value)
        elif key == "dtype":
            resolve_dtype(value, torch.device("cpu"))
        else:  # an attention backend
            from studylib.attention import attention

            x = torch.zeros(1, 1, 16, 16)
            attention(x, x, x, "dense", value)
    except StudylibError:
        return None
    except Exception as exc:  # noqa: BLE001 - any other failure is what the dry run exists to catch
        return f"fails with {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def _cuda_only(key: str, value: Any) -> list[tuple[str, Any]]:
    """The CUDA-only settings among one parameter: (kind, value) pairs."""
    out = []
    if key == "device" and isinstance(value, str) and value.startswith("cuda"):
        out.append(("device", value))
    if key == "dtype" and value in ("float16", "fp16"):
        out.append(("dtype", value))
    if key.endswith("backends") and isinstance(value, list | tuple):
        out += [(key, b) for b in value if b in ("triton", "cuda")]
    if key.endswith("backend") and value in ("triton", "cuda"):
        out.append((key, value))
    return out


def _patterns(key: str, value: Any) -> list[str]:
    if not (key.endswith("pattern") or key.endswith("patterns")):
        return []
    vals = value if isinstance(value, list | tuple) else [value]
    return [v for v in vals if isinstance(v, str)]


def dry_run(profile: str = "cpu", chapters: Sequence[int] | None = None, overrides: Mapping[str, Any] | None = None,
            notebooks_dir: str | Path | None = None, params_dir: str | Path | None = None) -> list[str]:
    """Check ``profile`` (plus ``overrides``) against the chapter notebooks; returns one line per problem."""
    import papermill as pm
    import torch

    from studylib.attention import Pattern
    from studylib.workbook import paths
    from studylib.workbook.runner import chapter_parameters, declared_parameters, discover, load_profile

    nb_dir = Path(notebooks_dir) if notebooks_dir else paths.notebooks_dir()
    p_dir = Path(params_dir) if params_dir else nb_dir / "params"
    yaml_path = p_dir / f"{profile}.yaml"
    cfg = load_profile(profile, p_dir)  # unreadable YAML is one StudylibError line already
    available = discover(nb_dir)
    if not available:
        return [f"no chapter notebooks (NN_name.ipynb) in {nb_dir}"]
    wanted = list(chapters) if chapters else sorted(available)
    problems = [f"no chapter {c} in {nb_dir}" for c in wanted if c not in available]
    wanted = [c for c in wanted if c in available]
    overrides = dict(overrides or {})
    known_sections = {"common", "budgets", *(f"ch{c:02d}" for c in available)}
    problems += [f"{yaml_path}: section {s!r} names no chapter notebook (sections: common, ch01..)"
                 for s in cfg if s not in known_sections]
    declared_all: set[str] = set()
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        for c in wanted:
            nb = available[c]
            where = f"ch{c:02d} ({nb.name})"
            declared = declared_parameters(nb)
            declared_all |= declared
            for key in sorted(set(cfg.get(f"ch{c:02d}", {})) - declared):
                problems.append(f"{yaml_path}: ch{c:02d} sets {key!r}, which {nb.name} has no parameter for; "
                                "fix the spelling or add it to the notebook's parameters cell")
            params = chapter_parameters(cfg, c, declared, overrides, profile)
            out = Path(tmp) / nb.name
            try:
                pm.execute_notebook(str(nb), str(out), parameters=params, prepare_only=True, kernel_name="python3",
                                    progress_bar=False, log_output=False)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{where}: papermill cannot inject the parameters: {exc}")
                continue
            default_src, injected_src = parameter_cells(json.loads(out.read_text(encoding="utf-8")))
            defaults: dict[str, Any] = {}
            try:
                exec(compile(default_src, f"{nb.name}[parameters]", "exec"), {}, defaults)  # noqa: S102
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{where}: its parameters cell does not run: {exc}")
                continue
            final = dict(defaults)
            try:
                exec(compile(injected_src, f"{nb.name}[injected]", "exec"), {}, final)  # noqa: S102
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{where}: the injected parameters do not run: {exc}")
                continue
            for key in params:
                if key in defaults and not _compatible(defaults[key], final.get(key)):
                    problems.append(f"{where}: {key} = {final.get(key)!r} is {_type_name(final.get(key))}, but the "
                                    f"notebook's default is {_type_name(defaults[key])} ({defaults[key]!r})")
            for key, value in final.items():
                if key == "model" or key.endswith("_model"):
                    why = _check_model(value)
                    if why:
                        problems.append(f"{where}: {key}: {why}")
                for spec in _patterns(key, value):
                    try:
                        Pattern.parse(spec)
                    except StudylibError as err:
                        problems.append(f"{where}: {key}: {str(err).rstrip('.')}")
                if not cuda:
                    for kind, v in _cuda_only(key, value):
                        why = _cuda_guard(kind if kind in ("device", "dtype") else "backend", v)
                        if why:
                            problems.append(f"{where}: {key}={v!r} needs CUDA, and without it {why} instead of "
                                            "stopping with a clear message")
    unused = sorted(set(overrides) - declared_all)
    if unused:
        problems.append(f"-p {', '.join(unused)}: no chosen chapter has such a parameter; check the spelling "
                        "against the notebooks' parameters cells")
    return problems


def cuda_settings(profile: str, params_dir: str | Path | None = None) -> list[str]:
    """The CUDA-only settings a profile makes, for the dry run's summary line."""
    from studylib.workbook import paths
    from studylib.workbook.runner import load_profile

    cfg = load_profile(profile, Path(params_dir) if params_dir else paths.notebooks_dir() / "params")
    found = []
    for section, values in cfg.items():
        for key, value in values.items():
            found += [f"{section}.{key}={v}" for _, v in _cuda_only(key, value)]
    return found
