"""The decode-time linear layer on CPU: a weight-streaming kernel for few rows, MKL/oneDNN otherwise.

On CPU a decode step is bound by reading the weights. MKL's M = 1 GEMV streams them, but from two
rows on its GEMM packs (copies) each weight matrix before multiplying, so verifying 5 tokens costs
about twice a 1-token step. ``csrc/stream_linear.c`` reads each weight row once and dots it with every
input row while it sits in L1: on the 2-core EPYC dev box the 30 layers of SmolLM2-135M take 19 ms
for 1 row (MKL: 37 ms) and 25 ms for 5 rows (MKL: 62 ms). Past ~32 rows (prefill) MKL's GEMM wins, so
``linear`` hands those to ``F.linear``.

The kernel is row-invariant: a row's result has the same bits whatever else is in the batch (see the
C source), so a token verified in a block of 5 equals the token decoded alone. It takes fp32 or bf16
weights; bf16 weights are widened to fp32 in registers and accumulated in fp32, so bf16 reads half the
bytes (this CPU has no bf16 FMA, and oneDNN's bf16 GEMM is slower than fp32 from 2 rows on).

``STUDYLIB_CPU_LINEAR`` picks the backend: ``auto`` (default: the kernel when a C compiler and AVX2/FMA
are present, else MKL), ``stream`` (the kernel or a clear error) or ``torch`` (always ``F.linear``).
``backend()`` names the one in use; reports record it in their provenance.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from studylib.errors import StudylibError
from studylib.models import invariant
from studylib.models.build import AVX2_FLAGS, compile_kernel, has_avx2_fma
from studylib.models.quant import QuantTensor
from studylib.models.quant import linear as quant_linear

STREAM_MAX_ROWS = 32  # measured crossover with MKL's GEMM on the dev box (equal at 32 rows)
_SRC = Path(__file__).parent / "csrc" / "stream_linear.c"
_MODES = ("auto", "stream", "torch")
_STREAM_DTYPES = (torch.float32, torch.bfloat16)
_log = logging.getLogger(__name__)
_state: dict = {}  # mode -> loaded function, or None with the reason in _state["why"]


def mode() -> str:
    m = os.environ.get("STUDYLIB_CPU_LINEAR", "auto").strip().lower() or "auto"
    if m not in _MODES:
        raise StudylibError(f"STUDYLIB_CPU_LINEAR={m!r} is not one of {', '.join(_MODES)}; unset it or pick one.")
    return m


def _build() -> Path:
    return compile_kernel(_SRC, AVX2_FLAGS)


def _load():
    # The per-call fast path: one dict lookup keyed by the raw setting (a tuple, so no setting can
    # collide with the mode names or "why").
    setting = ("env", os.environ.get("STUDYLIB_CPU_LINEAR"))
    if setting in _state:
        return _state[setting]
    m = mode()
    if m in _state:
        _state[setting] = _state[m]
        return _state[m]
    fn = None
    if m != "torch":
        try:
            if not has_avx2_fma():
                raise StudylibError("this CPU lacks AVX2/FMA")
            lib = ctypes.CDLL(str(_build()))
            fn = {torch.float32: lib.stream_linear_f32, torch.bfloat16: lib.stream_linear_bf16}
            for f in fn.values():
                f.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
                f.restype = None
        except (StudylibError, OSError) as err:
            if m == "stream":
                raise StudylibError(
                    f"STUDYLIB_CPU_LINEAR=stream, but the streaming kernel is unavailable ({err}); install a C "
                    "compiler (gcc) on an AVX2 machine, or set STUDYLIB_CPU_LINEAR=auto or torch.") from None
            _log.warning("streaming CPU linear unavailable (%s); using F.linear (MKL)", err)
            _state["why"] = str(err)
    _state[m] = _state[setting] = fn
    return fn


def backend() -> str:
    """``stream`` or ``torch``: what fp32/bf16 linears with few rows use on this machine right now."""
    return "stream" if _load() is not None else "torch"


def stream_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel itself, for any row count: (..., K) x (N, K) -> (..., N) in x's dtype, on CPU.

    fp32 or bf16 weights; x is taken to fp32 (exact from bf16) and the fp32 result is rounded back to
    x's dtype once, as a bf16 GEMM with an fp32 accumulator does."""
    fns = _load()
    if fns is None:
        raise StudylibError(f"the streaming CPU linear is off (STUDYLIB_CPU_LINEAR={mode()}, {_state.get('why', '')})")
    K = weight.shape[1]
    if weight.dtype not in fns or x.dtype != weight.dtype or x.device.type != "cpu" or x.shape[-1] != K:
        raise ValueError(f"stream_linear takes fp32 or bf16 CPU tensors of one dtype with matching K, got "
                         f"{x.dtype} {tuple(x.shape)} x {weight.dtype} {tuple(weight.shape)}")
    return _stream(fns[weight.dtype], x, weight, bias)


def _stream(fn, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # Decode calls this ~120 times per token, so it does only what the kernel needs: each torch call
    # here costs about a microsecond, as much as the kernel itself on a small matrix.
    K, N = x.shape[-1], weight.shape[0]
    if weight.dim() != 2 or weight.shape[1] != K or (bias is not None and bias.numel() != N):
        raise ValueError(f"stream_linear: x (..., {K}) x weight {tuple(weight.shape)} + bias "
                         f"{None if bias is None else tuple(bias.shape)}: the weight must be (N, {K}) and the bias (N,)")
    x32 = x if x.dtype is torch.float32 else x.float()
    if not x32.is_contiguous():
        x32 = x32.contiguous()
    if not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and (bias.dtype is not torch.float32 or not bias.is_contiguous()):
        bias = bias.float().contiguous()
    y = torch.empty(x.shape[:-1] + (N,), dtype=torch.float32)
    M = y.numel() // N if N else 0
    if M:
        fn(x32.data_ptr(), K, weight.data_ptr(), None if bias is None else bias.data_ptr(),
           y.data_ptr(), M, K, N, torch.get_num_threads())
    return y if x.dtype is torch.float32 else y.to(x.dtype)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The pure-PyTorch reference of ``stream_linear``: the same product in float64, rounded to x's dtype
    (the kernel's fp32 sums differ from it only by rounding)."""
    y = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    return y.to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, except that fp32/bf16 CPU inference with at most ``STREAM_MAX_ROWS`` rows streams,
    and block-format weights (``quant.QuantTensor``) go to their own kernel."""
    if type(weight) is QuantTensor:
        return quant_linear(x, weight, bias)
    if invariant.active() and invariant.applies(x, weight) and not (
            torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return invariant.gemm(x, weight, bias)  # batch-invariant serving (see models.invariant)
    if (
        x.dtype in _STREAM_DTYPES
        and weight.dtype is x.dtype
        and x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.numel() <= STREAM_MAX_ROWS * x.shape[-1]
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        fns = _load()
        if fns is not None:
            return _stream(fns[x.dtype], x, weight, bias)
    return F.linear(x, weight, bias)
