"""Building the C kernels: one compiler call per source, flags and compiler, cached as a shared library.

Every kernel of the study (``models/csrc``, ``attention/csrc``) is compiled here and nowhere else, so the
cache key (the source, the headers it includes, the flags and the compiler's version) is computed one
way. This module imports nothing from ``studylib.models``: the kernels' Python modules import it, never
the other way round."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from studylib.cpuinfo import cpu_flags
from studylib.errors import StudylibError

# -ffp-contract=off: no compiler-chosen FMA in the scalar tail, so the arithmetic is exactly the C code's.
AVX2_FLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]


def has_avx2_fma() -> bool:
    """Whether this CPU runs the single-build AVX2 kernels (stream_linear, quest_decode)."""
    return {"avx2", "fma"} <= cpu_flags()


def compile_kernel(src: Path, flags: list[str] | None = None, deps: tuple[Path, ...] = ()) -> Path:
    """Compile a C kernel once per source/flags/compiler into a shared library, cached beside the
    converted models (``$STUDYLIB_CACHE/kernels``); returns its path. ``deps``: files it #includes,
    so that editing them rebuilds it too."""
    from studylib.cache import cache_dir

    flags = list(AVX2_FLAGS if flags is None else flags)
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise StudylibError(f"no C compiler ({cc!r}) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    text = src.read_bytes() + b"".join(d.read_bytes() for d in deps)
    key = hashlib.sha256(text + " ".join(flags + version).encode()).hexdigest()[:16]
    out = cache_dir("kernels") / f"{src.stem}-{key}.so"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_so = Path(tmp) / out.name
        proc = subprocess.run([cc, *flags, str(src), "-o", str(tmp_so)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise StudylibError(f"compiling {src.name} failed: {proc.stderr.strip()[-400:]}")
        os.replace(tmp_so, out)  # atomic, so concurrent first uses never load a half-written file
    return out
