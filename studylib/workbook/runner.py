"""Execute the chapter notebooks with papermill, render each to HTML, and write the index page.

Failure isolation: a chapter runs with ``out_dir`` pointing at a private staging folder; only when
the whole notebook succeeds (and wrote its ``chNN.json``) are its files moved into the report
folder. A failed chapter leaves the last good ``chNN.html``/``chNN.json`` untouched and gets a
``chNN.failed.html`` of the partially executed notebook instead.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from studylib.errors import StudylibError
from studylib.workbook.chapter import to_jsonable
from studylib.workbook.paths import PROFILES, atomic_write, read_index

NOTEBOOK_RE = re.compile(r"^(\d\d)_[\w.-]+\.ipynb$")
OK, FAILED, UP_TO_DATE = "ok", "failed", "up to date"
# Set in the kernel's environment so library progress bars stay out of the rendered cells.
QUIET_ENV = {"STUDYLIB_PROGRESS": "0", "TQDM_DISABLE": "1"}
# tqdm.auto warns "IProgress not found" in a kernel without ipywidgets, which would print into a cell.
QUIET_WARNINGS = "ignore:IProgress not found"


@dataclass
class ChapterRun:
    chapter: int
    notebook: str
    status: str  # ok | failed | up to date
    seconds: float = 0.0
    error: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    finished: str = ""
    dirty_tree: bool = False  # made from a git tree with uncommitted changes to tracked files

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def discover(notebooks_dir: str | Path) -> dict[int, Path]:
    """Chapter number -> notebook, for every ``NN_name.ipynb`` in ``notebooks_dir``."""
    found: dict[int, Path] = {}
    for path in sorted(Path(notebooks_dir).glob("*.ipynb")):
        m = NOTEBOOK_RE.match(path.name)
        if not m:
            continue
        n = int(m.group(1))
        if n in found:
            raise StudylibError(f"two notebooks claim chapter {n}: {found[n].name} and {path.name}; rename one.")
        found[n] = path
    return found


def parse_chapters(text: str | None) -> list[int] | None:
    """"1,2" or "1-3" -> [1, 2] / [1, 2, 3]; None means all chapters."""
    if not text:
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
        except ValueError:
            raise StudylibError(f"--chapters takes numbers like 1,2 or 1-3, got {text!r}.") from None
    return sorted(set(out))


def parse_overrides(items: Sequence[str] | None) -> dict[str, Any]:
    """``["model=x", "batch=8"]`` -> {"model": "x", "batch": 8}; values are read as YAML scalars/lists."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise StudylibError(f"-p takes key=value (e.g. -p model=smollm2-135m), got {item!r}.")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def load_profile(profile: str, params_dir: str | Path) -> dict[str, dict[str, Any]]:
    import yaml

    path = Path(params_dir) / f"{profile}.yaml"
    if not path.exists():
        have = sorted(p.stem for p in Path(params_dir).glob("*.yaml")) or list(PROFILES)
        raise StudylibError(f"unknown profile {profile!r}: no {path}; choose one of {', '.join(have)}.")
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise StudylibError(f"{path} is not valid YAML ({exc}); fix the file.") from None
    if not isinstance(cfg, dict) or not all(isinstance(v, dict | None) for v in cfg.values()):
        raise StudylibError(f"{path} must map sections (common, ch01, ch02, ...) to parameter mappings.")
    return {k: dict(v or {}) for k, v in cfg.items()}


def declared_parameters(notebook: Path) -> set[str]:
    import papermill as pm

    return set(pm.inspect_notebook(str(notebook)))


def kernel_for_this_python() -> str:
    """``studylib`` if that kernelspec runs this very interpreter (``make setup`` installs it into the
    venv), else ``python3``, which jupyter_client maps to ``sys.executable``."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("studylib")
    except NoSuchKernel:
        return "python3"
    exe = spec.argv[0] if spec.argv else ""
    same = Path(exe).absolute().parent == Path(sys.executable).absolute().parent
    return "studylib" if same or exe in ("python", "python3") else "python3"


@contextlib.contextmanager
def _env(extra: Mapping[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def library_sources() -> list[Path]:
    """The files whose change makes every chapter stale: the studylib package's Python sources."""
    import studylib

    return sorted(Path(studylib.__file__).resolve().parent.rglob("*.py"))


def source_mtime(notebook: Path, params_file: Path) -> float:
    """Newest modification time among the notebook, its profile and the library sources."""
    return max(p.stat().st_mtime for p in [notebook, params_file, *library_sources()])


def up_to_date(out_dir: Path, chapter: int, notebook: Path, params_file: Path, params: dict,
               previous: Mapping[str, Any] | None) -> bool:
    outs = [out_dir / f"ch{chapter:02d}.html", out_dir / f"ch{chapter:02d}.json"]
    if not all(p.exists() for p in outs) or not previous:
        return False
    if previous.get("status") != OK or previous.get("params") != to_jsonable(params):
        return False
    return min(p.stat().st_mtime for p in outs) > source_mtime(notebook, params_file)


def tree_is_dirty() -> bool:
    """Whether the checkout differs from HEAD outside reports/: tracked changes or untracked files git does not
    ignore (what ``git_dirty`` in provenance says)."""
    from studylib.bench.provenance import git_state

    return git_state()[1]


def committed_reports(out: Path) -> bool:
    """Whether ``out`` is (inside) a report folder the repository commits: under ``<repo>/reports/``
    and not ignored by git (reports/smoke and reports/_tmp* are scratch)."""
    from studylib.workbook import paths

    reports = (paths.repo_root() / "reports").resolve()
    out = out.resolve()
    if not out.is_relative_to(reports):
        return False
    try:
        # The trailing "/" lets directory patterns (/reports/smoke/) match a folder not created yet.
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", f"{out}/"], cwd=reports.parent,
                                 capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ignored = False
    return not ignored


def check_clean_tree(out: Path, allow_dirty: bool) -> bool:
    """Refuse (StudylibError) to write a committed report folder from a dirty tree unless ``allow_dirty``:
    its pages would claim results of a commit that did not produce them. Returns whether the tree is dirty."""
    dirty = tree_is_dirty()
    if dirty and not allow_dirty and committed_reports(out):
        raise StudylibError(
            f"the git tree has uncommitted changes to tracked files, and {out} is a committed report folder; "
            "commit or stash the changes first, or pass --allow-dirty (every page is then marked as made "
            "from a dirty tree).")
    return dirty


def _publish_tree(src: Path, dest: Path) -> None:
    for f in sorted(src.rglob("*")):
        if f.is_file():
            target = dest / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, target)


def _error_text(exc: BaseException) -> str:
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        return f"cell [{exc.exec_count}]: {exc.ename}: {exc.evalue}"
    return f"{type(exc).__name__}: {exc}"


def _warn_figure_defects(log: Path, nn: str) -> None:
    """One line on stderr per defect the figure check found; the log itself is published with the chapter."""
    try:
        defects = json.loads(log.read_text(encoding="utf-8"))["defects"]
    except (OSError, ValueError, KeyError):
        return
    for d in defects:
        print(f"{nn}: figure defect: {d}", file=sys.stderr)


def run_chapter(notebook: Path, chapter: int, params: dict[str, Any], out_dir: Path, kernel_name: str,
                cell_timeout: float | None = None, dirty: bool = False) -> ChapterRun:
    """Execute one notebook; publish its outputs only if it succeeded. Never raises for a failed cell.
    ``dirty``: the git tree had uncommitted changes; the page says so."""
    import nbformat
    import papermill as pm

    from studylib.workbook import figure_check
    from studylib.workbook.render import render_html

    nn = f"ch{chapter:02d}"
    staging = out_dir / ".staging"
    stage, executed = staging / nn, staging / f"{nn}.ipynb"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    executed.unlink(missing_ok=True)
    params = {**params, "out_dir": str(stage)}
    t0 = time.perf_counter()
    error = None
    try:
        warn = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), QUIET_WARNINGS) if w)
        # The kernel's figure checks (studylib.workbook.figure_check) go beside the chapter's JSON.
        figures = {figure_check.LOG_ENV: str(stage / f"{nn}.figures.json")}
        # the parameters the chapter runs with, for the code fingerprint its record carries
        from studylib.code_registration import PARAMS_ENV

        passed = {PARAMS_ENV: json.dumps(to_jsonable({k: v for k, v in params.items() if k != "out_dir"}))}
        with _env({**QUIET_ENV, "PYTHONWARNINGS": warn, **figures, **passed}):
            pm.execute_notebook(str(notebook), str(executed), parameters=params, kernel_name=kernel_name,
                                cwd=str(notebook.parent), progress_bar=False, log_output=False,
                                execution_timeout=cell_timeout)
        if not (stage / f"{nn}.json").exists():
            error = (f"the notebook ran but wrote no {nn}.json; end it with "
                     f"studylib.workbook.save_chapter(chapter={chapter}, ..., out_dir=out_dir).")
    except Exception as exc:  # a failing chapter must not stop the others
        error = _error_text(exc)
    seconds = time.perf_counter() - t0
    try:
        nb = nbformat.read(str(executed), as_version=4) if executed.exists() else None
        if error is None:
            _warn_figure_defects(stage / f"{nn}.figures.json", nn)
            _publish_tree(stage, out_dir)
            atomic_write(out_dir / f"{nn}.html", render_html(nb, dirty=dirty))
            os.replace(executed, out_dir / f"{nn}.ipynb")
            for stale in (f"{nn}.failed.html", f"{nn}.failed.ipynb"):
                (out_dir / stale).unlink(missing_ok=True)
        else:
            atomic_write(out_dir / f"{nn}.failed.html", render_html(nb, error=error, title=notebook.stem, dirty=dirty))
            if nb is not None:
                os.replace(executed, out_dir / f"{nn}.failed.ipynb")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        executed.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            staging.rmdir()
    finished = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    return ChapterRun(chapter, notebook.name, FAILED if error else OK, round(seconds, 1), error,
                      to_jsonable({k: v for k, v in params.items() if k != "out_dir"}), finished, dirty)


def chapter_parameters(cfg: Mapping[str, dict], chapter: int, declared: set[str], overrides: Mapping[str, Any],
                       profile: str) -> dict[str, Any]:
    """common (where the notebook declares the key) < chNN section < -p overrides (where declared)."""
    params = {k: v for k, v in cfg.get("common", {}).items() if k in declared}
    params.update(cfg.get(f"ch{chapter:02d}", {}))
    params.update({k: v for k, v in overrides.items() if k in declared})
    params["profile"] = profile
    return params


REGISTERED_PROFILES = ("cpu", "gpu")  # the profiles whose results are meant to be confirmatory


def warn_unregistered(profile: str, params: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """Say, before anything runs, which chapters' code or parameters differ from their registration
    (``studylib.code_registration``): their decisions will be exploratory. Returns the lines printed."""
    from studylib.code_registration import read_registry, stale

    if profile not in read_registry() and profile not in REGISTERED_PROFILES:
        return []  # a profile nobody registers (smoke, a user's own): its results are exploratory anyway
    lines = []
    for c, p in params.items():
        why = stale(profile, c, p)
        if why:
            lines.append(f"ch{c:02d}: {'; '.join(why)}: its decisions will be exploratory (register with "
                         f"`studylib register --profile {profile}` and commit before the run)")
    for line in lines:
        print(f"studylib: warning: {line}", file=sys.stderr)
    return lines


def reproduce(profile: str = "cpu", chapters: Sequence[int] | None = None, out_dir: str | Path | None = None,
              overrides: Mapping[str, Any] | None = None, resume: bool = False,
              notebooks_dir: str | Path | None = None, params_dir: str | Path | None = None,
              progress: bool = True, cell_timeout: float | None = None,
              allow_dirty: bool = False) -> list[ChapterRun]:
    """Run the chosen chapters of ``profile`` and (re)write ``<out_dir>/index.html``.

    From a git tree with uncommitted changes this refuses to write a committed report folder
    (``reports/cpu``...) unless ``allow_dirty``; pages made from a dirty tree carry a visible note."""
    from studylib.progress import progress_bar
    from studylib.workbook import paths
    from studylib.workbook.render import write_index

    nb_dir = Path(notebooks_dir) if notebooks_dir else paths.notebooks_dir()
    p_dir = Path(params_dir) if params_dir else nb_dir / "params"
    cfg = load_profile(profile, p_dir)
    available = discover(nb_dir)
    if not available:
        raise StudylibError(f"no chapter notebooks (NN_name.ipynb) in {nb_dir}; run from the repository root.")
    wanted = list(chapters) if chapters else sorted(available)
    missing = [c for c in wanted if c not in available]
    if missing:
        raise StudylibError(f"no chapter {', '.join(map(str, missing))} in {nb_dir}; available chapters: "
                            f"{', '.join(map(str, sorted(available)))}.")
    out = Path(out_dir) if out_dir else paths.reports_dir(profile)
    out = out.resolve()
    dirty = check_clean_tree(out, allow_dirty)
    out.mkdir(parents=True, exist_ok=True)
    overrides = dict(overrides or {})
    declared = {c: declared_parameters(available[c]) for c in wanted}
    unused = sorted(set(overrides) - set().union(*declared.values()))
    if unused:
        raise StudylibError(f"-p {', '.join(unused)}: no chosen chapter has such a parameter; check the "
                            "spelling against the notebooks' parameters cells.")
    for c in wanted:
        stray = sorted(set(cfg.get(f"ch{c:02d}", {})) - declared[c])
        if stray:
            raise StudylibError(f"{p_dir / (profile + '.yaml')}: ch{c:02d} sets {', '.join(stray)}, which "
                                f"{available[c].name} has no parameter for; fix the spelling or add it to the "
                                "notebook's parameters cell.")
    index = read_index(out)
    records: dict[str, Any] = dict(index.get("chapters", {}))
    kernel = kernel_for_this_python()
    warn_unregistered(profile, {c: chapter_parameters(cfg, c, declared[c], overrides, profile) for c in wanted})
    ledger_on = committed_reports(out)
    params_file = p_dir / f"{profile}.yaml"
    runs: list[ChapterRun] = []
    bar = progress_bar(wanted, desc=f"reproduce {profile}", unit="chapter", progress=progress)
    for c in bar:
        nb = available[c]
        params = chapter_parameters(cfg, c, declared[c], overrides, profile)
        prev = records.get(str(c))
        bar.set_description(f"ch{c:02d} {nb.stem}")
        # A page made from a dirty tree is stale once the tree is clean: its mark must not outlive the edit.
        if (resume and up_to_date(out, c, nb, params_file, params, prev)
                and not (prev.get("dirty_tree") and not dirty)):
            run = ChapterRun(c, nb.name, UP_TO_DATE, prev.get("seconds", 0.0), None, prev["params"],
                             prev.get("finished", ""), bool(prev.get("dirty_tree")))
        else:
            run = run_chapter(nb, c, params, out, kernel, cell_timeout, dirty=dirty)
            records[str(c)] = run.to_dict()
            if not dirty and tree_is_dirty():
                # a file added or edited while the chapters run makes every later result "of a dirty tree"
                bar.write(f"studylib: warning: the git tree changed during the run (`git status`); ch{c:02d}'s "
                          "decisions read exploratory: leave the tree alone while `make reproduce` runs",
                          file=sys.stderr)
            if ledger_on and run.status == OK:
                from studylib import ledger

                with contextlib.suppress(OSError, json.JSONDecodeError):
                    ledger.append(json.loads((out / f"ch{c:02d}.json").read_text(encoding="utf-8")))
        runs.append(run)
        budget = (cfg.get("budgets") or {}).get(f"ch{c:02d}")
        if budget is not None and str(c) in records:
            records[str(c)]["budget_s"] = float(budget) * 60
            if run.status == OK and run.seconds > float(budget) * 60:
                bar.write(f"studylib: warning: ch{c:02d} took {run.seconds / 60:.1f} min, over its budget of "
                          f"{float(budget):g} min in {params_file.name}", file=sys.stderr)
        bar.set_postfix_str(f"ch{c:02d} {run.status} in {run.seconds:.0f} s")
        bar.write(f"ch{c:02d} {nb.stem}: {run.status} ({run.seconds:.1f} s)"
                  + (f"\n  error: {run.error}" if run.error else ""), file=sys.stderr)
        # Rewrite the index after every chapter, so an interrupted run still leaves a correct index.
        index = {"profile": profile, "updated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                 "chapters": records}
        atomic_write(out / "index.json", json.dumps(index, indent=1, ensure_ascii=False))
        write_index(out, index, available)
    bar.close()
    if any(out.glob("ch[0-9][0-9].ipynb")):
        from studylib.workbook.assemble import build_book

        build_book(out, index)  # the book: every page with its neighbours' links, the front page, book.html
    return runs
