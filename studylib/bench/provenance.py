"""Who, what, where and when a result was measured: printed atop every report, stored in JSON."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("studylib", "torch", "transformers", "triton", "numpy", "scipy", "papermill")


def _git(*args: str) -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:
        return ""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_linear_backend() -> str:
    """Which kernel ran fp32 decode linears on CPU ("stream" or "torch"): it moves CPU speed ~1.5x."""
    try:
        from studylib.models.cpu_linear import backend

        return backend()
    except Exception as err:  # provenance must never fail a report
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
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_commit": (_git("rev-parse", "HEAD") or "unknown") + ("+dirty" if dirty else ""),
        "versions": versions,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        "cpu_linear": _cpu_linear_backend(),
        "params": params,
    }
