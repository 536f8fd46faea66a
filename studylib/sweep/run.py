"""Run a sweep's cells as Ray tasks: each cell is one papermill execution of a chapter.

Where: ``address`` None or ``local`` starts a local Ray cluster on this machine's cores; ``auto`` joins
the cluster this machine belongs to (``ray start``); ``ray://HOST:PORT`` reaches a remote one through
Ray Client. Every node needs this checkout's environment (the same studylib and notebooks), as for any
Ray job; the cell's notebook travels with the task and its outputs come back to the driver, which
writes them under the sweep's folder, so workers need no shared disk.

Per cell, ``<out>/<cell>/``: the chapter's ``chNN.json``, the executed ``chNN.ipynb``, its ``chNN.html``
and ``cell.json``: status, attempts, error, seconds, and the provenance of where it ran (host, device,
ISA, commit), with the cell's key. ``<out>/sweep.json`` lists every cell.

Failures stay local: a cell whose notebook fails (or whose worker dies) runs again up to ``retries``
times, then is recorded failed with its error; the other cells go on and keep their results.
Resume: with ``resume``, a cell whose ``cell.json`` says ok under the same key (the commit, the cell's
parameters and the model file's sha256) and whose outputs exist is not run again."""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from studylib.errors import StudylibError
from studylib.sweep.spec import Cell, SweepSpec

OK, FAILED, UP_TO_DATE = "ok", "failed", "up to date"


def where_it_ran() -> dict[str, Any]:
    """Host, device, ISA and commit of this process (a worker's own, on a cluster)."""
    from studylib.bench.provenance import cpu_isa, cpu_model, git_state

    dev = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            dev = f"cuda: {torch.cuda.get_device_name(0)}"
    except Exception:  # noqa: BLE001 - a worker without torch still reports where it ran
        pass
    return {"host": socket.gethostname(), "device": dev, "cpu": cpu_model(), "isa": cpu_isa().get("label"),
            "commit": git_state()[0]}


def execute_cell(notebook_name: str, notebook_text: str, chapter: int, params: dict[str, Any],
                 cell_timeout: float | None, dirty: bool) -> dict[str, Any]:
    """One papermill execution, in a private folder; returns the run record, its files (relative path ->
    bytes) and where it ran. Never raises for a failing notebook (``run_chapter`` isolates it)."""
    from studylib.workbook.runner import kernel_for_this_python, run_chapter

    with tempfile.TemporaryDirectory(prefix="studylib-cell-") as tmp:
        root = Path(tmp)
        nb = root / "notebooks" / notebook_name
        nb.parent.mkdir(parents=True)
        nb.write_text(notebook_text, encoding="utf-8")
        out = root / "out"
        out.mkdir()
        run = run_chapter(nb, chapter, params, out, kernel_for_this_python(), cell_timeout, dirty=dirty)
        files = {str(f.relative_to(out)): f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()}
    return {"run": run.to_dict(), "files": files, "where": where_it_ran()}


def tree_hash() -> str | None:
    """sha256 of the uncommitted changes (``git diff HEAD`` and untracked files): two dirty trees with
    different edits are different code. None when clean (or without git)."""
    import hashlib
    import subprocess

    from studylib.workbook import paths

    root = paths.repo_root()
    try:
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=root, capture_output=True, timeout=30).stdout
        untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "-z"], cwd=root,
                                   capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if not diff and not untracked:
        return None
    h = hashlib.sha256(diff)
    for name in filter(None, untracked.split(b"\0")):
        h.update(name)
        f = root / name.decode(errors="replace")
        if f.is_file():
            h.update(f.read_bytes())
    return h.hexdigest()


def cell_key(cell: Cell, params: Mapping[str, Any], commit: str, tree: str | None = None) -> dict[str, Any]:
    """What a cell's results depend on: the code (commit, plus the uncommitted changes' hash), its
    parameters, the model file's sha256, and the machine (CPU and ISA: a timing from another machine is
    not this machine's)."""
    from studylib.bench.provenance import cpu_isa, cpu_model, model_sha256
    from studylib.workbook.chapter import to_jsonable

    return {"commit": commit, "uncommitted": tree, "params": to_jsonable(dict(params)),
            "model_sha256": model_sha256(params.get("model")), "cpu": cpu_model(), "isa": cpu_isa().get("label")}


def _plan(spec: SweepSpec, notebooks_dir: Path | None, params_dir: Path | None):
    """(cells, {cell: full chapter parameters}, {chapter: notebook path})."""
    from studylib.workbook import paths
    from studylib.workbook.runner import chapter_parameters, declared_parameters, discover, load_profile

    nb_dir = notebooks_dir or paths.notebooks_dir()
    p_dir = params_dir or nb_dir / "params"
    cfg = load_profile(spec.profile, p_dir)
    available = discover(nb_dir)
    cells = spec.expand()
    full, notebooks = {}, {}
    for c in cells:
        nb = available[c.chapter]
        notebooks[c.chapter] = nb
        full[c.name] = chapter_parameters(cfg, c.chapter, declared_parameters(nb), c.params, spec.profile)
    return cells, full, notebooks


def check(spec: SweepSpec, notebooks_dir: Path | None = None, params_dir: Path | None = None) -> list[str]:
    """Every cell through ``reproduce``'s dry run (keys the chapter declares, value types, model specs,
    CUDA-only settings): one line per problem, prefixed by the cell."""
    from studylib.workbook import paths
    from studylib.workbook.dry_run import dry_run
    from studylib.workbook.runner import discover

    nb_dir = notebooks_dir or paths.notebooks_dir()
    p_dir = params_dir or nb_dir / "params"
    if not (p_dir / f"{spec.profile}.yaml").exists():
        return [f"{spec.path or 'the spec'}: profile {spec.profile!r} has no {p_dir / (spec.profile + '.yaml')}"]
    available = discover(nb_dir)
    missing = [c for c in spec.chapters if c not in available]
    if missing:
        return [f"{spec.path or 'the spec'}: no chapter {c} in {nb_dir} (chapters: "
                f"{', '.join(map(str, sorted(available)))})" for c in missing]
    out = []
    for cell in spec.expand():
        for line in dry_run(spec.profile, [cell.chapter], cell.params, notebooks_dir=nb_dir, params_dir=p_dir):
            out.append(f"cell {cell.name}: {line}")
    return out


def _write_cell(dest: Path, result: dict[str, Any], record: dict[str, Any]) -> None:
    from studylib.workbook.paths import atomic_write

    dest.mkdir(parents=True, exist_ok=True)
    for rel, data in result.get("files", {}).items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        tmp.write_bytes(data)
        os.replace(tmp, target)
    atomic_write(dest / "cell.json", json.dumps(record, indent=1, default=str))


def _resumable(dest: Path, chapter: int, key: dict) -> bool:
    try:
        rec = json.loads((dest / "cell.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    outs = [dest / f"ch{chapter:02d}.json", dest / f"ch{chapter:02d}.ipynb"]
    return rec.get("status") == OK and rec.get("key") == key and all(p.exists() for p in outs)


def _unschedulable(ray, res: Mapping[str, float]) -> dict[str, float]:
    """The part of a cell's request no node of the cluster could ever satisfy (Ray would wait forever)."""
    have = ray.cluster_resources()
    names = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
    return {k: v for k, v in res.items() if v > have.get(names[k], 0.0) + 1e-9}


def init_ray(address: str | None, num_cpus: int | None = None):
    import ray

    kw = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address in (None, "", "local"):
        ray.init(num_cpus=num_cpus or os.cpu_count(), **kw)
    elif address == "auto" or address.startswith("ray://"):
        ray.init(address=address, **kw)
    else:
        raise StudylibError(f"--address {address!r}: use local (default), auto or ray://HOST:PORT.")
    return ray


def run_sweep(spec: SweepSpec, address: str | None = None, resume: bool = False, progress: bool = True,
              notebooks_dir: Path | None = None, params_dir: Path | None = None, out_dir: Path | None = None,
              cell_timeout: float | None = None, num_cpus: int | None = None) -> dict[str, Any]:
    """Run every cell (resuming finished ones with ``resume``); returns the sweep record (also
    ``<out>/sweep.json``)."""
    from studylib.bench.provenance import git_state
    from studylib.progress import progress_bar
    from studylib.workbook.paths import atomic_write

    bad = check(spec, notebooks_dir, params_dir)
    if bad:
        raise StudylibError("\n".join(bad))
    cells, full, notebooks = _plan(spec, notebooks_dir, params_dir)
    out = out_dir or spec.out_dir()
    out.mkdir(parents=True, exist_ok=True)
    commit, dirty = git_state()
    tree = tree_hash() if dirty else None
    keys = {c.name: cell_key(c, full[c.name], commit, tree) for c in cells}
    records: dict[str, dict] = {}
    todo = []
    for c in cells:
        if resume and _resumable(out / c.name, c.chapter, keys[c.name]):
            rec = json.loads((out / c.name / "cell.json").read_text(encoding="utf-8"))
            records[c.name] = {**rec, "status": UP_TO_DATE}
        else:
            todo.append(c)
    bar = progress_bar(total=len(cells), initial=len(cells) - len(todo), desc=f"sweep {spec.name}", unit="cell",
                       progress=progress)
    t0 = time.monotonic()
    if todo:
        ray = init_ray(address, num_cpus)
        try:
            res = {k: float(v) for k, v in spec.resources.items() if k in ("num_cpus", "num_gpus")}
            if spec.resources.get("memory_gb"):
                res["memory"] = float(spec.resources["memory_gb"]) * 2**30
            unschedulable = _unschedulable(ray, res)
            if unschedulable:
                raise StudylibError(f"each cell asks for {unschedulable}, more than this Ray cluster has "
                                    f"({ {k: v for k, v in ray.cluster_resources().items() if k in ('CPU', 'GPU', 'memory')} }); "
                                    "lower resources in the spec or use a bigger cluster (--address).")
            task = ray.remote(execute_cell).options(max_retries=0, **res)
            texts = {ch: nb.read_text(encoding="utf-8") for ch, nb in notebooks.items()}
            attempts = {c.name: 0 for c in todo}
            pending = {}

            def submit(c: Cell) -> None:
                attempts[c.name] += 1
                ref = task.remote(notebooks[c.chapter].name, texts[c.chapter], c.chapter, full[c.name], cell_timeout,
                                  dirty)
                pending[ref] = c

            queue = list(todo)
            limit = spec.concurrency or len(todo)
            while queue and len(pending) < limit:
                submit(queue.pop(0))
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                c = pending.pop(done[0])
                try:
                    result = ray.get(done[0])
                    error = result["run"].get("error")
                except Exception as exc:  # noqa: BLE001 - a dead worker is this cell's failure, not the sweep's
                    result, error = {"run": {"status": FAILED, "seconds": None}, "files": {}, "where": None}, \
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                if error and attempts[c.name] <= spec.retries:
                    bar.write(f"{c.name}: failed (attempt {attempts[c.name]}), retrying: {error}")
                    submit(c)
                    continue
                running_beside = len(pending)
                record = {"cell": c.name, "chapter": c.chapter, "overrides": c.params, "status": FAILED if error else OK,
                          "attempts": attempts[c.name], "error": error, "seconds": result["run"].get("seconds"),
                          "where": result.get("where"), "key": keys[c.name], "concurrency": spec.concurrency,
                          "cells_in_flight_at_finish": running_beside + 1,
                          "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
                # A failed attempt writes only its record and failure page: the last good results stay.
                _write_cell(out / c.name, result, record)
                if not error:
                    for stale in (out / c.name).glob(f"ch{c.chapter:02d}.failed.*"):
                        stale.unlink()
                records[c.name] = record
                bar.write(f"{c.name}: {record['status']}" + (f" ({record['seconds']:.0f} s)" if record["seconds"] else "")
                          + (f": {error}" if error else ""))
                bar.update(1)
                while queue and len(pending) < limit:
                    submit(queue.pop(0))
        finally:
            ray.shutdown()
    bar.close()
    summary = {"name": spec.name, "profile": spec.profile, "spec": spec.path, "description": spec.description,
               "grid": spec.grid, "params": spec.params, "chapters": spec.chapters, "resources": spec.resources,
               "retries": spec.retries, "commit": commit, "dirty": dirty,
               "seconds": round(time.monotonic() - t0, 1),
               "updated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
               "cells": [records[c.name] for c in cells]}
    atomic_write(out / "sweep.json", json.dumps(summary, indent=1, default=str))
    from studylib.sweep.page import write_sweep_page

    write_sweep_page(out)  # the front page links it at the next `studylib book` / reproduce
    return summary
