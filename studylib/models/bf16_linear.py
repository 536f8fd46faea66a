"""``--act bf16``: block-format weights times activations rounded to bf16, in bf16 dot products.

Block weights are small integers (Q4: 0..15 or -8..7, Q8_0: -128..127), exact in bf16, so only x is
rounded, element by element, to bf16 (8 significant bits; int8 keeps 8 bits per block of 32). The
per-block sums run on AVX512-BF16's ``vdpbf16ps`` (two multiply-adds per fp32 lane, half the fp32
path's FMAs); the block scale is applied once per block, as in the fp32 kernel. A model of its own,
between fp32 and int8 in closeness to the fp32 model (chapter 8 measures it).

``csrc/bf16_linear.c`` defines the arithmetic once (see its header): the order ``vdpbf16ps`` uses, which
was measured on hardware (odd element first, each add rounded; products exact), with denormals
flushed. So every path gives the same bits as ``reference`` (pure PyTorch) and a row's result never
depends on the rest of the step, like ``int8_linear``.

ISA: ``avx512bf16``, ``avx2`` (fp32 FMAs on the exact products: the same roundings), ``scalar``;
``STUDYLIB_BF16_ISA=auto|avx512bf16|avx2|scalar`` forces one, provenance records it. AMX-BF16 is not
a path: its tile multiply sums in an order no fp32 sequence reproduces (``benchmarks/amx_bf16_order.c``
measures that), so it could not give these bits; AMX machines use it through ``--act int8``.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from studylib.cpuinfo import cpu_flags
from studylib.models.isa_build import IsaFamily

BLOCK = 32
GROUP = 16  # weight rows per packed group: the 16 fp32 lanes of a 512-bit vector
CODES = {"q4_0": 0, "q4_1": 1, "q8_0": 2}
PATHS = ("avx512bf16", "avx2", "scalar")  # best first
_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
_FLAGS = {"scalar": [], "avx2": _AVX2,
          "avx512bf16": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", *_AVX2]}
_NEEDS = {
    "scalar": set(),
    "avx2": {"avx2", "fma", "f16c"},
    "avx512bf16": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx2", "fma", "f16c"},
}


def _cpu_flags() -> frozenset[str]:
    return cpu_flags()  # a seam: tests stand in other CPUs here


def _bind(so) -> None:  # the export beyond the family's common ones
    so.bf_round.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                            ctypes.c_void_p]
    so.bf_round.restype = None


_FAMILY = IsaFamily(source=Path(__file__).parent / "csrc" / "bf16_linear.c", env="STUDYLIB_BF16_ISA", define="BF_PATH",
                    paths=PATHS, needs=_NEEDS, flags=_FLAGS, cpu_flags=lambda: _cpu_flags(), bind=_bind,
                    prefix="bf", act="bf16", codes=CODES)


def available() -> list[str]:
    """The paths this CPU can run, best first (``scalar`` always)."""
    return _FAMILY.available()


def path() -> str:
    """The build this process uses for bf16 activations (``STUDYLIB_BF16_ISA``, else the best available)."""
    return _FAMILY.path()


def lib(name: str | None = None):
    """The compiled library of path ``name`` (default: ``path()``)."""
    return _FAMILY.lib(name)


def entry() -> int:
    """The address of this path's ``bf_linear`` (the fused step calls it for every linear)."""
    return _FAMILY.entry()


def pack(qt) -> torch.Tensor:
    """``qt``'s blocks in this kernel's layout, memoised on the tensor (``IsaFamily.pack``)."""
    return _FAMILY.pack(qt)


def linear(x: torch.Tensor, qt, bias: torch.Tensor | None = None, *, isa: str | None = None) -> torch.Tensor:
    """``x @ qt.T + bias`` with x rounded to bf16: (..., K) -> (..., N) fp32, any row count."""
    return _FAMILY.linear(x, qt, bias, isa=isa)


def round_activations(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) fp32 rounded to bf16 (to nearest, ties to even; a denormal becomes a signed zero), as
    fp32 values."""
    u = x.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # the bits, unsigned
    r = torch.where((u & 0x7F800000) == 0, u & 0x80000000, (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000)
    nan = ((u & 0x7F800000) == 0x7F800000) & ((u & 0x7FFFFF) != 0)
    r = torch.where(nan, (u & 0xFFFF0000) | 0x400000, r)  # a NaN stays a (quiet) NaN
    return torch.where(r >= 2**31, r - 2**32, r).to(torch.int32).view(torch.float32)


def _weights(qt) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The integer weights (N, K) as the kernels multiply them, and the fp32 scales d (and Q4_1's m)."""
    n, k = qt.shape
    nb = k // BLOCK
    blocks = qt.data.view(n, nb, qt.block_bytes)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float().reshape(n, nb)
    if qt.fmt == "q8_0":
        wq = blocks[..., 2:].contiguous().view(torch.int8).float()
    else:
        nib = blocks[..., (4 if qt.fmt == "q4_1" else 2):].to(torch.int64)
        wq = torch.cat([nib & 15, nib >> 4], dim=-1).float() - (8.0 if qt.fmt == "q4_0" else 0.0)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float().reshape(n, nb) if qt.fmt == "q4_1" else None
    return wq.reshape(n, nb, BLOCK), d, m


def reference(x: torch.Tensor, qt, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The canonical bf16 arithmetic in pure PyTorch, from the GGML blocks (not the packed layout):
    the kernels on every path must equal it bit for bit."""
    n, k = qt.shape
    nb = k // BLOCK
    lead = x.shape[:-1]
    xb = round_activations(x.reshape(-1, k)).reshape(-1, nb, BLOCK)
    wq, d, m = _weights(qt)
    # The definition flushes denormals (vdpbf16ps always does). The flag is per thread, so the reference runs
    # on this thread alone.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    flushed = torch.set_flush_denormal(True)
    try:
        acc = torch.zeros(xb.shape[0], n, dtype=torch.float32)
        for b in range(nb):  # block order; inside a block the pair order of vdpbf16ps, each add rounded
            s = torch.zeros_like(acc)
            for p in range(BLOCK // 2):
                for j in (2 * p + 1, 2 * p):
                    s = s + xb[:, b, j, None] * wq[None, :, b, j]  # the product is exact in fp32
            acc = acc + d[None, :, b] * s
            if m is not None:
                v = xb[:, b, :]
                for h in (16, 8, 4, 2, 1):
                    v = v[:, :h] + v[:, h:2 * h]
                acc = acc + m[None, :, b] * v[:, 0, None]
        if bias is not None:
            acc = acc + bias.float()
    finally:
        if flushed:
            torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    return acc.reshape(*lead, n)
