"""One C kernel built once per ISA path and chosen at run time: the machinery ``int8_linear`` and
``bf16_linear`` share.

A family names its paths best first, the /proc/cpuinfo flags each needs, its compiler flags, and the
environment switch that forces one (``STUDYLIB_INT8_ISA``, ``STUDYLIB_BF16_ISA``: ``auto`` or a path
name; a path this CPU lacks is an error naming what it lacks, not a silent fallback). Its C source
exports, under one symbol prefix (``i8``, ``bf``), ``<p>_linear``, ``<p>_pack``, ``<p>_packed_bytes`` and
``<p>_path`` with the same signatures, so packing a weight and running a linear are written once here."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

from studylib.errors import StudylibError

_LINEAR_ARGS = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]


class IsaFamily:
    def __init__(self, *, source: Path, env: str, define: str, paths: tuple[str, ...], needs: dict[str, set[str]],
                 flags: dict[str, list[str]], cpu_flags: Callable[[], frozenset[str]], prefix: str, act: str,
                 codes: dict[str, int], bind: Callable[[ctypes.CDLL], None] = lambda so: None):
        """``prefix``: the C symbols' prefix; ``act``: the arithmetic's name in messages (``int8``);
        ``codes``: block format -> the C format code; ``bind``: declares the source's other exports."""
        self.source, self.env, self.define, self.paths = source, env, define, paths
        self.needs, self.flags, self._cpu_flags, self._bind = needs, flags, cpu_flags, bind
        self.prefix, self.act, self.codes = prefix, act, codes
        self._libs: dict[str, ctypes.CDLL] = {}
        self._chosen: dict[tuple, str] = {}

    def _fn(self, so: ctypes.CDLL, name: str):
        return getattr(so, f"{self.prefix}_{name}")

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
            from studylib.models.build import compile_kernel

            # The C source numbers its paths from the last (scalar = 0) up to the best.
            flags = ["-O3", *self.flags[name], f"-D{self.define}={self.paths[::-1].index(name)}", "-ffp-contract=off",
                     "-fopenmp", "-shared", "-fPIC", "-lm"]
            # the headers beside the source (packed_blocks.h) are part of it: editing one rebuilds
            so = ctypes.CDLL(str(compile_kernel(self.source, flags, deps=tuple(sorted(self.source.parent.glob("*.h"))))))
            linear, pack, size, got = (self._fn(so, n) for n in ("linear", "pack", "packed_bytes", "path"))
            linear.argtypes, linear.restype = _LINEAR_ARGS, ctypes.c_int
            pack.argtypes, pack.restype = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                           ctypes.c_void_p], ctypes.c_int
            size.argtypes, size.restype = [ctypes.c_int, ctypes.c_int, ctypes.c_int], ctypes.c_size_t
            got.restype = ctypes.c_char_p
            self._bind(so)
            if got().decode() != name:
                raise StudylibError(f"the kernel {self.source.name} built for {name} reports {got().decode()}")
            self._libs[name] = so
        return self._libs[name]

    def entry(self) -> int:
        """The address of the chosen path's ``<p>_linear`` (the fused step calls it for every linear)."""
        return ctypes.cast(self._fn(self.lib(), "linear"), ctypes.c_void_p).value

    def pack(self, qt):
        """``qt``'s blocks in the kernel's layout (16-row groups, one record per block; the same bytes per
        weight as the GGUF, padded to 16 rows). Memoised on the tensor, per family."""
        import torch

        attr = f"_{self.prefix}_packed"
        packed = getattr(qt, attr, None)
        if packed is not None:
            return packed
        if qt.fmt not in self.codes:
            raise StudylibError(f"{self.act} activations take {', '.join(self.codes)} weights, not {qt.fmt}.")
        n, k = qt.shape
        so = self.lib("scalar")  # packing is layout only: any build does it the same way
        code = self.codes[qt.fmt]
        out = torch.empty(self._fn(so, "packed_bytes")(code, n, k), dtype=torch.uint8)
        if self._fn(so, "pack")(code, qt.data.data_ptr(), n, k, out.data_ptr()):
            raise StudylibError(f"packing a {qt.fmt} {qt.shape} weight failed")
        setattr(qt, attr, out)
        return out

    def linear(self, x, qt, bias=None, *, isa: str | None = None):
        """``x @ qt.T + bias`` with x rounded by this family's arithmetic: (..., K) -> (..., N) fp32, any rows."""
        import torch

        from studylib.models.quant import check_operands, kernel_operands

        n, k = qt.shape
        check_operands(f"{self.act} linear of a {qt.fmt} weight", x, n, k, bias)
        so = self.lib(isa)
        wp = self.pack(qt)
        x32, bias, y, m = kernel_operands(x, bias, n)
        if m and self._fn(so, "linear")(self.codes[qt.fmt], x32.data_ptr(), k, wp.data_ptr(),
                                         None if bias is None else bias.data_ptr(), y.data_ptr(), m, k, n,
                                         torch.get_num_threads()):
            raise StudylibError(f"{self.act} linear failed for {qt.fmt} {qt.shape}")
        return y
