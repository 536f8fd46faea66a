"""Who, what, where and when a result was measured: printed atop every report, stored in JSON."""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("studylib", "torch", "transformers", "triton", "numpy", "scipy", "papermill")
# The /proc/cpuinfo flags that decide which CPU kernels are fast (bf16 arithmetic, wide FMA, AMX tiles).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except Exception:
        return ""


def git_state() -> tuple[str, bool]:
    """(the full 40-hex HEAD commit or "unknown", whether tracked files outside ``reports/`` differ from it).

    ``reports/`` is left out: it holds the study's outputs, which a reproduce run rewrites chapter by
    chapter; what makes a result "of a commit" is the code, notebooks, parameters and data."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return "unknown", False
    return commit, bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)reports"))


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
    from studylib.cpuinfo import cpu_flags, parse_flags

    have = cpu_flags() if cpuinfo is None else parse_flags(cpuinfo)
    flags = [f for f in ISA_FLAGS if f in have]
    if {"amx_bf16", "amx_tile"} <= have:
        label = "amx_bf16"
    elif "avx512_bf16" in have:
        label = "avx512_bf16"
    elif "avx512f" in have:
        label = "avx512"
    elif "avx2" in have:
        label = "avx2"
    else:
        label = "baseline"
    return {"label": label, "flags": flags}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _backend(module: str, name: str) -> str:
    """``module.name()``, the kernel a code path runs right now, or "unknown (why)": provenance must never
    fail a report."""
    try:
        return getattr(importlib.import_module(module), name)()
    except Exception as err:
        return f"unknown ({err})"


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
        "gpu": gpu,
        # Which kernels ran: each moves CPU timings (stream vs MKL linears ~1.5x; Quest's C kernel in
        # chapter 6; the block-format build, avx512 / avx2 / torch, for --weights other than dense).
        "cpu_linear": _backend("studylib.models.cpu_linear", "backend"),
        "quest_kernel": _backend("studylib.attention.quest", "kernel_backend"),
        "quant_kernel": _backend("studylib.models.quant", "isa"),
        "invariant_kernels": _backend("studylib.models.invariant", "describe"),
        "params": params,
    }
