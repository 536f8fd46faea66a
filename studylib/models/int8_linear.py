"""``--act int8``: block-format weights times activations rounded to int8 per 32-block, in integers.

The fp32 path (``quant.py``) widens every 4-bit weight to fp32 and multiplies in fp32, so from two
rows on a step is bound by fp32 FMAs and v(k), the cost of a k-row step relative to one row, grows
almost linearly. Rounding each row of x to int8 per block of 32 with an fp32 scale (the scheme
llama.cpp uses with Q4/Q8 weights) turns the inner products into integer dot-product instructions,
which do 4x (VNNI) to far more (AMX) multiply-adds per instruction. It is a model of its own: its
logits differ from the fp32 model's by the rounding of x (chapter 8 measures by how much).

``csrc/int8_linear.c`` defines the arithmetic once (see its header): integer block sums, which are
exact in any order, then element-wise fp32 steps in block order. So every ISA path gives the same
bits as ``reference`` (pure PyTorch) and a row's result never depends on the rest of the step: a
token verified in a block of 16, batched with 63 requests or prefilled is the token decoded alone.

ISA: built once per path and chosen at run time from /proc/cpuinfo, best first: ``amx`` (AMX-INT8
tiles for steps of ``amx_min_rows()`` rows or more on weights of ``AMX_MIN_WEIGHTS`` entries or more,
AVX512-VNNI otherwise), ``avx512vnni``, ``avxvnni``, ``avx2``
(``vpmaddubsw``), ``scalar`` (plain C, any x86). ``STUDYLIB_INT8_ISA=auto|amx|...|scalar`` forces one
(tests run each path this CPU has); ``path()`` names the one in use and provenance records it.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from studylib.cpuinfo import cpu_flags
from studylib.errors import StudylibError
from studylib.models.isa_build import IsaFamily

BLOCK = 32
AMX_MIN_WEIGHTS = 1 << 21  # csrc/int8_linear.c's AMX_MIN_WEIGHTS (why: its comment there)
GROUP = 16  # weight rows per packed group (the lanes of a 512-bit vector, the columns of an AMX tile)
CODES = {"q4_0": 0, "q4_1": 1, "q8_0": 2}
PATHS = ("amx", "avx512vnni", "avxvnni", "avx2", "scalar")  # best first
_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
_AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", *_AVX2]
_FLAGS = {"scalar": [], "avx2": _AVX2, "avxvnni": [*_AVX2, "-mavxvnni"], "avx512vnni": _AVX512,
          "amx": [*_AVX512, "-mamx-tile", "-mamx-int8"]}
_NEEDS = {
    "scalar": set(),
    "avx2": {"avx2", "fma", "f16c"},
    "avxvnni": {"avx2", "fma", "f16c", "avx_vnni"},
    "avx512vnni": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"},
    "amx": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma", "amx_tile", "amx_int8"},
}


def _cpu_flags() -> frozenset[str]:
    return cpu_flags()  # a seam: tests stand in other CPUs here


def _bind(so) -> None:  # the export beyond the family's common ones
    so.i8_quantize.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    so.i8_quantize.restype = None
    so.i8_set_amx_min_rows.argtypes, so.i8_set_amx_min_rows.restype = [ctypes.c_int], ctypes.c_int


_FAMILY = IsaFamily(source=Path(__file__).parent / "csrc" / "int8_linear.c", env="STUDYLIB_INT8_ISA", define="I8_PATH",
                    paths=PATHS, needs=_NEEDS, flags=_FLAGS, cpu_flags=lambda: _cpu_flags(), bind=_bind,
                    prefix="i8", act="int8", codes=CODES)


def available() -> list[str]:
    """The paths this CPU can run, best first (``scalar`` always)."""
    return _FAMILY.available()


def path() -> str:
    """The build this process uses for int8 activations (``STUDYLIB_INT8_ISA``, else the best available)."""
    return _FAMILY.path()


def lib(name: str | None = None):
    """The compiled library of path ``name`` (default: ``path()``)."""
    return _FAMILY.lib(name)


def amx_min_rows(rows: int | None = None) -> int:
    """The fewest rows a step needs for the ``amx`` build to use its tiles, on a weight of ``AMX_MIN_WEIGHTS``
    entries or more (fewer rows, or a smaller weight, go to its AVX512-VNNI code). With ``rows``, sets it for
    this process (1: tiles at every row count and every shape) and returns the previous value;
    without, returns the current one. It changes no bit, only which units do the work."""
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise StudylibError(f"amx_min_rows takes a row count >= 1, got {rows!r}.")
    return int(lib("amx").i8_set_amx_min_rows(0 if rows is None else rows))


def amx_rule() -> str:
    """For provenance: from how many rows this process's int8 steps use AMX tiles, or why they use none."""
    if path() != "amx":
        return f"not used (path {path()})"
    rows = amx_min_rows()
    return "tiles at every shape" if rows == 1 else f"tiles from {rows} rows on weights of {AMX_MIN_WEIGHTS} entries or more"


def entry() -> int:
    """The address of this path's ``i8_linear`` (the fused step calls it for every linear)."""
    return _FAMILY.entry()


def pack(qt) -> torch.Tensor:
    """``qt``'s blocks in this kernel's layout, memoised on the tensor (``IsaFamily.pack``)."""
    return _FAMILY.pack(qt)


def linear(x: torch.Tensor, qt, bias: torch.Tensor | None = None, *, isa: str | None = None) -> torch.Tensor:
    """``x @ qt.T + bias`` with x rounded to int8: (..., K) -> (..., N) fp32, any row count."""
    return _FAMILY.linear(x, qt, bias, isa=isa)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rounding of x (M, K) fp32, in PyTorch: (q int8 (M, K), dx (M, K/32), Sq int32, sx)."""
    m, k = x.shape
    xb = x.float().reshape(m, k // BLOCK, BLOCK)
    d = xb.abs().amax(-1) / 127.0
    inv = torch.where(d != 0, 1.0 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))
    q = torch.round(xb * inv[..., None]).clamp(-127, 127)  # torch.round: to nearest, ties to even
    sq = q.sum(-1).to(torch.int32)
    sx = d * sq.float()
    return q.to(torch.int8).reshape(m, k), d, sq, sx


def reference(x: torch.Tensor, qt, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The canonical int8 arithmetic in pure PyTorch, from the GGML blocks (not the packed layout):
    the kernels on every path must equal it bit for bit."""
    n, k = qt.shape
    nb = k // BLOCK
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    q, dx, sq, sx = quantize_activations(x2)
    blocks = qt.data.view(n, nb, qt.block_bytes)
    dw = blocks[..., 0:2].contiguous().view(torch.float16).float().reshape(n, nb)
    if qt.fmt == "q8_0":
        wq = blocks[..., 2:].contiguous().view(torch.int8).to(torch.float64)
    else:
        nib = blocks[..., (4 if qt.fmt == "q4_1" else 2):].to(torch.int64)
        wq = torch.cat([nib & 15, nib >> 4], dim=-1).to(torch.float64)
    # Exact integer block sums (products < 2^15, sums < 2^21: exact in float64).
    s = torch.einsum("mbk,nbk->mnb", q.reshape(-1, nb, BLOCK).to(torch.float64), wq).to(torch.int64)
    if qt.fmt == "q4_0":
        s = s - 8 * sq.to(torch.int64)[:, None, :]
    sf = s.to(torch.float32)
    acc = torch.zeros(x2.shape[0], n, dtype=torch.float32)
    mw = blocks[..., 2:4].contiguous().view(torch.float16).float().reshape(n, nb) if qt.fmt == "q4_1" else None
    for b in range(nb):  # block order, element-wise fp32: mul, mul, add (no FMA), as in the C kernels
        t = dw[None, :, b] * dx[:, b, None]
        acc = acc + t * sf[:, :, b]
        if mw is not None:
            acc = acc + mw[None, :, b] * sx[:, b, None]
    if bias is not None:
        acc = acc + bias.float()
    return acc.reshape(*lead, n)
