"""Weights in GGML block formats (Q4_0, Q4_1, Q8_0): storage, a pure-PyTorch reference, the C kernel.

A ``QuantTensor`` is an (N, K) weight kept as its blocks (32 weights per block along K), exactly as a
GGUF file stores it. ``dequantize_ref`` is the pure-PyTorch reference every kernel is tested against;
``linear`` runs ``csrc/quant_linear.c``, which widens the blocks in registers and computes in fp32, so
a block model computes with exactly its stored weights (see the C source for why x is not rounded).

ISA: the kernel is compiled twice, for AVX-512 and for AVX2, and the build this CPU runs is chosen at
run time from /proc/cpuinfo. ``STUDYLIB_QUANT_ISA=auto|avx512|avx2`` forces one (``avx2`` on an
AVX-512 machine tests the other path); ``isa()`` names the one in use, and reports record it.

Few rows (decode, verification, small batches) go through the kernel; more than ``KERNEL_MAX_ROWS``
(prefill) dequantise the matrix once per call and hand it to the BLAS GEMM, where compute, not the
weight bytes, is the bound.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from studylib.cpuinfo import cpu_flags
from studylib.errors import StudylibError

BLOCK = 32
FORMATS = {"q4_0": (0, 18), "q4_1": (1, 20), "q8_0": (2, 34)}  # name -> (kernel code, bytes per block)
# Up to this many rows the row-invariant kernel runs (decode, verify blocks, token trees: the same limit
# as the fused step, so every step a tree verification can take computes each row alike); past it
# (prefill) dequantise + GEMM is faster.
KERNEL_MAX_ROWS = 64
_CSRC = Path(__file__).parent / "csrc"
_SRC, _DEPS = _CSRC / "decode_layers.c", (_CSRC / "quant_linear.c",)  # one library: the linear and the layers
_ISA_FLAGS = {
    "avx512": ["-mavx512f", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
}
_NEEDS = {"avx512": {"avx512f", "f16c", "fma"}, "avx2": {"avx2", "f16c", "fma"}}
_ISA_MODES = ("auto", "avx512", "avx2")
_libs: dict[str, object] = {}
_isa_cache: dict[tuple, str] = {}


@dataclass(eq=False)
class QuantTensor:
    """An (N, K) weight as GGML blocks: ``data`` is uint8 (N, K / 32 * bytes per block)."""

    data: torch.Tensor
    fmt: str
    shape: tuple[int, int]
    prefill_dtype: torch.dtype = torch.float32  # bf16: long steps multiply in bf16 (``+bf16prefill``)
    act: str = "fp32"  # int8 / bf16: every step rounds x and multiplies in that arithmetic (``act_kernel``)

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise StudylibError(f"unsupported block format {self.fmt!r} (this engine reads {', '.join(sorted(FORMATS))}); "
                                "re-quantise the checkpoint to one of them.")
        n, k = self.shape
        if k % BLOCK or self.data.dtype != torch.uint8 or tuple(self.data.shape) != (n, k // BLOCK * self.block_bytes):
            raise StudylibError(f"{self.fmt} data of shape {tuple(self.data.shape)} does not hold a {n}x{k} weight "
                                f"(widths must be multiples of {BLOCK})")
        self.data = self.data.contiguous()

    @property
    def block_bytes(self) -> int:
        return FORMATS[self.fmt][1]

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32  # what it computes in: activations stay fp32

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantised rows ``ids`` (any shape of int64) as fp32, shape ids.shape + (K,): embedding lookup."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.shape[0]):
            raise StudylibError(f"token id out of range for a vocabulary of {self.shape[0]} (got "
                                f"{int(flat.min())}..{int(flat.max())}); the prompt ids do not belong to this model.")
        kernels = lib()
        if kernels is None:
            out = dequantize_ref(QuantTensor(self.data[flat], self.fmt, (flat.numel(), self.shape[1])))
        else:
            out = torch.empty(flat.numel(), self.shape[1], dtype=torch.float32)
            if flat.numel():
                kernels.quant_dequant_rows(FORMATS[self.fmt][0], self.data.data_ptr(), self.shape[1],
                                           flat.data_ptr(), flat.numel(), out.data_ptr(), torch.get_num_threads())
        return out.view(*ids.shape, self.shape[1])

    def dequantize(self) -> torch.Tensor:
        """The whole (N, K) weight as fp32 (the kernel's, or the reference's where there is no kernel)."""
        kernels = lib()
        if kernels is None:
            return dequantize_ref(self)
        out = torch.empty(self.shape, dtype=torch.float32)
        kernels.quant_dequant_rows(FORMATS[self.fmt][0], self.data.data_ptr(), self.shape[1], None, self.shape[0],
                                   out.data_ptr(), torch.get_num_threads())
        return out


def dequantize_ref(qt: QuantTensor) -> torch.Tensor:
    """Pure-PyTorch dequantisation, the reference for every kernel: (N, K) fp32."""
    n, k = qt.shape
    blocks = qt.data.view(n, k // BLOCK, qt.block_bytes)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # (n, nb, 1)
    if qt.fmt == "q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
        return (d * q).reshape(n, k)
    start = 4 if qt.fmt == "q4_1" else 2
    nib = blocks[..., start:].to(torch.int32)
    q = torch.cat([nib & 15, nib >> 4], dim=-1).float()  # byte j: weight j low, weight j + 16 high
    if qt.fmt == "q4_0":
        return (d * (q - 8)).reshape(n, k)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float()
    return (d * q + m).reshape(n, k)


def quantize(w: torch.Tensor, fmt: str) -> QuantTensor:
    """Round-to-nearest block quantisation of an (N, K) weight, as ggml's reference quantisers do."""
    if fmt not in FORMATS:
        raise StudylibError(f"unknown block format {fmt!r}; use one of {', '.join(sorted(FORMATS))}.")
    n, k = w.shape
    if k % BLOCK:
        raise StudylibError(f"{fmt} needs the input width to be a multiple of {BLOCK}, got {k}.")
    x = w.detach().float().cpu().reshape(n, k // BLOCK, BLOCK)
    if fmt == "q8_0":
        amax = x.abs().amax(-1, keepdim=True)
        d = (amax / 127).half()
        inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(amax))
        q = torch.round(x * inv).clamp(-127, 127).to(torch.int8).view(torch.uint8)
        body = [d.view(torch.uint8).reshape(n, -1, 2), q]
    elif fmt == "q4_0":
        # The signed value of largest magnitude maps to -8, as in ggml: the full 16 levels are used.
        idx = x.abs().argmax(-1, keepdim=True)
        vmax = torch.gather(x, -1, idx)
        d = (vmax / -8).half()
        inv = torch.where(d.float() != 0, 1 / d.float(), torch.zeros_like(vmax))
        q = torch.clamp(torch.floor(x * inv + 8.5), 0, 15).to(torch.uint8)
        body = [d.view(torch.uint8).reshape(n, -1, 2), q[..., :16] | (q[..., 16:] << 4)]
    else:
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        d = ((hi - lo) / 15).half()
        m = lo.half()
        inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(lo))
        q = torch.clamp(torch.floor((x - m.float()) * inv + 0.5), 0, 15).to(torch.uint8)
        body = [d.view(torch.uint8).reshape(n, -1, 2), m.view(torch.uint8).reshape(n, -1, 2),
                q[..., :16] | (q[..., 16:] << 4)]
    data = torch.cat(body, dim=-1).reshape(n, -1)
    return QuantTensor(data, fmt, (n, k))


def _cpu_flags() -> frozenset[str]:
    return cpu_flags()  # a seam: tests stand in other CPUs here


def isa_mode() -> str:
    m = os.environ.get("STUDYLIB_QUANT_ISA", "auto").strip().lower() or "auto"
    if m not in _ISA_MODES:
        raise StudylibError(f"STUDYLIB_QUANT_ISA={m!r} is not one of {', '.join(_ISA_MODES)}; unset it or pick one.")
    return m


def isa() -> str:
    """The kernel build this process uses: ``avx512``, ``avx2`` or ``torch`` (no kernel: the reference).
    Memoised per setting: it is asked on every block-format linear call."""
    key = (os.environ.get("STUDYLIB_QUANT_ISA"), _cpu_flags)
    if key not in _isa_cache:
        _isa_cache[key] = _choose_isa()
    return _isa_cache[key]


def _choose_isa() -> str:
    m = isa_mode()
    flags = _cpu_flags()
    if m == "auto":
        return next((name for name in ("avx512", "avx2") if _NEEDS[name] <= flags), "torch")
    if not _NEEDS[m] <= flags:
        raise StudylibError(f"STUDYLIB_QUANT_ISA={m}, but this CPU lacks {sorted(_NEEDS[m] - flags)}; "
                            "use auto or a path the CPU has.")
    return m


def lib():
    """The loaded kernel library for this CPU, or None where only the reference runs."""
    name = isa()
    if name == "torch":
        return None
    if name not in _libs:
        from studylib.models.build import compile_kernel

        flags = ["-O3", *_ISA_FLAGS[name], "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]
        so = ctypes.CDLL(str(compile_kernel(_SRC, flags, _DEPS)))
        so.quant_linear.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_int]
        so.quant_dequant_rows.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                           ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        so.quant_linear.restype = so.quant_dequant_rows.restype = so.decode_layers.restype = ctypes.c_int
        so.decode_layers.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int] * 7,
                                      ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        so.decode_layers_set_act.argtypes = [ctypes.c_void_p]
        so.decode_layers_set_act.restype = None
        _libs[name] = so
    return _libs[name]


_X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_operands(name: str, x: torch.Tensor, n: int, k: int, bias: torch.Tensor | None) -> None:
    """Raise ``ValueError`` naming what is wrong before a C linear over an (n, k) weight reads ``x`` and
    ``bias``: a wrong width or bias length would read past the tensors' ends, not fail."""
    if x.shape[-1:] == (k,) and x.dtype in _X_DTYPES and x.device.type == "cpu" and (
            bias is None or (bias.shape == (n,) and bias.device.type == "cpu" and bias.dtype.is_floating_point)):
        return
    if x.dim() == 0 or x.shape[-1] != k:
        problem = f"x has shape {tuple(x.shape)}; its last dimension must be the weight's width {k}"
    elif x.dtype not in _X_DTYPES:
        problem = f"x is {x.dtype}; it must be float32, bfloat16 or float16"
    elif x.device.type != "cpu":
        problem = f"x is on {x.device}; the kernel runs on the CPU"
    else:
        problem = (f"the bias is {bias.dtype} {tuple(bias.shape)} on {bias.device}; it must be a floating CPU "
                   f"vector of the weight's {n} outputs")
    raise ValueError(f"{name}: {problem}")


def kernel_operands(x: torch.Tensor, bias: torch.Tensor | None, n: int):
    """What a C linear over ``n`` outputs takes: (x as contiguous fp32, the bias as contiguous fp32 or
    None, the fp32 output (..., n), its row count). Call ``check_operands`` first."""
    x32 = x if x.dtype is torch.float32 else x.float()
    if not x32.is_contiguous():
        x32 = x32.contiguous()
    if bias is not None and (bias.dtype is not torch.float32 or not bias.is_contiguous()):
        bias = bias.float().contiguous()
    y = torch.empty(x.shape[:-1] + (n,), dtype=torch.float32)
    return x32, bias, y, (y.numel() // n if n else 0)


def kernel_linear(x: torch.Tensor, w: QuantTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The C kernel for any row count: (..., K) fp32 x (N, K) blocks -> (..., N) fp32."""
    kernels = lib()
    if kernels is None:
        raise StudylibError("no block-format kernel on this CPU (it needs AVX2/FMA/F16C)")
    n, k = w.shape
    check_operands(f"{w.fmt} linear", x, n, k, bias)
    x32, bias, y, m = kernel_operands(x, bias, n)
    if m and kernels.quant_linear(FORMATS[w.fmt][0], x32.data_ptr(), k, w.data.data_ptr(),
                              None if bias is None else bias.data_ptr(), y.data_ptr(), m, k, n,
                              torch.get_num_threads()):
        raise StudylibError(f"quant_linear failed for {w.fmt} {w.shape}")
    return y


# The activation arithmetics other than fp32 (``--act``), each a kernel family of its own module with the
# same interface (CODES, pack, linear, reference, path, entry).
ACT_KERNELS = {"int8": "studylib.models.int8_linear", "bf16": "studylib.models.bf16_linear"}


def act_kernel(act: str):
    """The kernel module of activation arithmetic ``act`` (None for fp32)."""
    if act == "fp32":
        return None
    import importlib

    return importlib.import_module(ACT_KERNELS[act])


def linear(x: torch.Tensor, w: QuantTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w.T + bias`` in fp32 (returned in x's dtype): the kernel for few rows, else dequantise + GEMM;
    with ``w.act`` int8 or bf16, that arithmetic's kernel for every row count."""
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: x has width {x.shape[-1]}, the {w.fmt} weight {w.shape[1]}")
    if w.act != "fp32" and x.device.type == "cpu":
        # One arithmetic for every row count (decode, verification, batches, prefill): see int8_linear.
        y = act_kernel(w.act).linear(x, w, bias)
        return y if x.dtype is torch.float32 else y.to(x.dtype)
    rows = x.numel() // max(x.shape[-1], 1)
    if rows <= KERNEL_MAX_ROWS and x.device.type == "cpu" and lib() is not None:
        y = kernel_linear(x, w, bias)
    elif w.prefill_dtype is torch.bfloat16:
        # bf16 activations and weights in the BLAS GEMM (AMX / AVX512_BF16), fp32 accumulation and output.
        y = F.linear(x.to(torch.bfloat16), w.dequantize().to(torch.bfloat16)).float()
        if bias is not None:
            y = y + bias.float()
    else:
        y = F.linear(x.float(), w.dequantize(), None if bias is None else bias.float())
    return y if x.dtype is torch.float32 else y.to(x.dtype)


def reference_linear(x: torch.Tensor, w: QuantTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The pure-PyTorch reference of ``kernel_linear``: the blocks dequantised by ``dequantize_ref`` and
    multiplied in float64, rounded to fp32."""
    y = F.linear(x.double(), dequantize_ref(w).double(), None if bias is None else bias.double())
    return y.float()


def embedding_and_head(model) -> dict[str, QuantTensor]:
    """The embedding (and an untied head) as Q8_0, in every re-quantised format as in the GGUF file
    (4-bit heads cost quality for few bytes: llama.cpp's Q4 mixes keep them at Q6_K/Q8_0 too)."""
    out = {"embed": quantize(model.model.embed_tokens.weight, "q8_0")}
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        out["head"] = quantize(model.lm_head.weight, "q8_0")
    return out
