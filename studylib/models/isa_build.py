"""One C kernel built once per ISA path and chosen at run time: the machinery ``int8_linear`` and
``bf16_linear`` share.

A family names its paths best first, the /proc/cpuinfo flags each needs, its compiler flags, and the
environment switch that forces one (``STUDYLIB_INT8_ISA``, ``STUDYLIB_BF16_ISA``: ``auto`` or a path
name; a path this CPU lacks is an error naming what it lacks, not a silent fallback)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

from studylib.errors import StudylibError


class IsaFamily:
    def __init__(self, *, source: Path, env: str, define: str, paths: tuple[str, ...], needs: dict[str, set[str]],
                 flags: dict[str, list[str]], cpu_flags: Callable[[], frozenset[str]],
                 bind: Callable[[ctypes.CDLL], None], path_symbol: str):
        self.source, self.env, self.define, self.paths = source, env, define, paths
        self.needs, self.flags, self._cpu_flags, self._bind, self._path_symbol = needs, flags, cpu_flags, bind, path_symbol
        self._libs: dict[str, ctypes.CDLL] = {}
        self._chosen: dict[tuple, str] = {}

    def available(self) -> list[str]:
        """The paths this CPU can run, best first (``scalar``, the last, always)."""
        have = self._cpu_flags()
        return [p for p in self.paths if self.needs[p] <= have]

    def path(self) -> str:
        """The build this process uses: the environment switch, else the best available."""
        raw = os.environ.get(self.env)
        key = (raw, self._cpu_flags())
        if key not in self._chosen:
            m = (raw or "auto").strip().lower() or "auto"
            if m != "auto" and m not in self.paths:
                raise StudylibError(f"{self.env}={m!r} is not one of auto, {', '.join(self.paths)}; unset it or pick one.")
            have = self.available()
            if m != "auto" and m not in have:
                raise StudylibError(f"{self.env}={m}, but this CPU lacks {sorted(self.needs[m] - key[1])}; "
                                    f"use auto or one of {', '.join(have)}.")
            self._chosen[key] = have[0] if m == "auto" else m
        return self._chosen[key]

    def lib(self, name: str | None = None) -> ctypes.CDLL:
        """The compiled library of path ``name`` (default: ``path()``)."""
        name = name or self.path()
        if name not in self.paths:
            raise StudylibError(f"no {self.source.stem} path {name!r}; the paths are {', '.join(self.paths)}.")
        if name not in self.available():  # it would load, then die of an illegal instruction
            raise StudylibError(f"this CPU cannot run the {name} build of {self.source.stem} (it lacks "
                                f"{sorted(self.needs[name] - self._cpu_flags())}); use one of {', '.join(self.available())}.")
        if name not in self._libs:
            from studylib.models.cpu_linear import compile_kernel

            # The C source numbers its paths from the last (scalar = 0) up to the best.
            flags = ["-O3", *self.flags[name], f"-D{self.define}={self.paths[::-1].index(name)}", "-ffp-contract=off",
                     "-fopenmp", "-shared", "-fPIC", "-lm"]
            so = ctypes.CDLL(str(compile_kernel(self.source, flags)))
            self._bind(so)
            got = getattr(so, self._path_symbol)
            got.restype = ctypes.c_char_p
            if got().decode() != name:
                raise StudylibError(f"the kernel {self.source.name} built for {name} reports {got().decode()}")
            self._libs[name] = so
        return self._libs[name]
