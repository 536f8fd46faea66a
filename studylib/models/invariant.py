"""Batch-invariant CPU kernels: a token's logits do not depend on what it is batched with.

Batched inference is not bit-reproducible with stock kernels: MKL's GEMM (and its GEMV for one row)
and SDPA choose their reduction order from the shape, so the same row computed with 1, 5 or 64 other
rows differs in the last bits, and greedy decoding flips wherever two logits nearly tie (Thinking
Machines, "Defeating nondeterminism in LLM inference", 2025). A serving engine then stops matching
single-request decoding. Two C kernels fix every output's arithmetic, whatever the batch:

- ``gemm`` (``csrc/invariant_gemm.c``): y = x @ w.T as one FMA chain over k per output, vectorised
  across output columns of a packed copy of the weight. On AVX-512 it matches MKL up to ~256 rows and
  is within ~20% past that; AVX2 and the scalar fallback give the same bits as AVX-512.
- ``attention`` (``csrc/invariant_attention.c``): causal attention of a ragged batch (prefill chunks
  and decodes together) over keys named by slot indices, so one call serves the paged pool's whole
  step and the dense cache of the single-request decoder alike, with a fixed per-query reduction.

``with invariant.enabled(): ...`` routes the model's fp32 CPU linears and plain causal attention
through them (``cpu_linear.linear``, ``DenseKVCache.attend``, ``PagedBatch.attend``); inside it the
single-request AR decoder and the serving engine under any batch, chunking or prefix hit compute
bit-identical logits. Outside it nothing changes. ``STUDYLIB_INVARIANT_ISA`` = avx512 | avx2 | scalar
forces a code path (tests run each one the CPU has); ``isa()`` names the one in use.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from studylib.cpuinfo import cpu_flags
from studylib.errors import StudylibError

_DIR = Path(__file__).parent / "csrc"
_BASE = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC"]
_ISA_FLAGS = {"avx512": ["-mavx512f", "-mavx2", "-mfma"], "avx2": ["-mavx2", "-mfma"], "scalar": []}
_state: dict = {}
_lock = threading.Lock()
_on = threading.local()
NR = 32  # columns per packed panel (the C kernel's NR)


def best_isa() -> str:
    flags = cpu_flags()
    if "avx512f" in flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "scalar"


def isa() -> str:
    """The code path the kernels use here: ``STUDYLIB_INVARIANT_ISA`` if set, else the best the CPU has."""
    want = os.environ.get("STUDYLIB_INVARIANT_ISA", "").strip().lower() or best_isa()
    if want not in _ISA_FLAGS:
        raise StudylibError(f"STUDYLIB_INVARIANT_ISA={want!r} is not one of avx512, avx2, scalar; unset it or pick one.")
    order = list(_ISA_FLAGS)
    if order.index(want) < order.index(best_isa()):
        raise StudylibError(f"STUDYLIB_INVARIANT_ISA={want} but this CPU only has {best_isa()}; unset it or pick "
                            f"{best_isa()} or lower.")
    return want


def _libs(which: str):
    key = (which, isa())
    if key in _state:
        return _state[key]
    from studylib.models.build import compile_kernel

    with _lock:
        if key not in _state:
            src = _DIR / ("invariant_gemm.c" if which == "gemm" else "invariant_attention.c")
            lib = ctypes.CDLL(str(compile_kernel(src, _BASE + _ISA_FLAGS[key[1]])))
            if which == "gemm":
                lib.invariant_gemm.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_void_p,
                                               ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
                lib.invariant_gemm.restype = None
                lib.invariant_pack.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
                lib.invariant_pack.restype = None
            else:
                p, s = ctypes.c_void_p, ctypes.c_ssize_t
                lib.invariant_attention.argtypes = [p, s, s, p, p, s, s, p, p, p, p, ctypes.c_int, ctypes.c_int,
                                                    ctypes.c_int, ctypes.c_int, ctypes.c_float, p, ctypes.c_int]
                lib.invariant_attention.restype = None
            _state[key] = lib
    return _state[key]


def available() -> tuple[bool, str]:
    """(True, isa) when the kernels compile and load here, else (False, why)."""
    try:
        _libs("gemm")
        _libs("attention")
        return True, isa()
    except (StudylibError, OSError) as err:
        return False, str(err)


def describe() -> str:
    """For provenance: the code path in use, or why the kernels are off."""
    ok, what = available()
    return what if ok else f"unavailable ({what})"


# ---- the switch -------------------------------------------------------------------------------
def active() -> bool:
    return getattr(_on, "depth", 0) > 0


@contextlib.contextmanager
def enabled():
    """Route fp32 CPU linears and plain causal attention through the invariant kernels."""
    ok, why = available()
    if not ok:
        raise StudylibError(f"the batch-invariant kernels are unavailable ({why}); install a C compiler (gcc).")
    _on.depth = getattr(_on, "depth", 0) + 1
    try:
        yield
    finally:
        _on.depth -= 1


def applies(*tensors: torch.Tensor) -> bool:
    """The kernels take fp32 CPU tensors; anything else keeps the stock path."""
    return active() and all(t.dtype is torch.float32 and t.device.type == "cpu" for t in tensors)


# ---- the kernels ------------------------------------------------------------------------------
def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight (N, K) as ceil(N / 32) panels of (K, 32), zero-padded; cached per weight tensor."""
    hit = getattr(weight, "_invariant_packed", None)  # kept on the tensor: it lives and dies with it
    if hit is not None and hit[0] == weight._version:
        return hit[1]
    w = weight.detach().contiguous()
    N, K = w.shape
    packed = torch.empty((N + NR - 1) // NR, K, NR, dtype=torch.float32)
    _libs("gemm").invariant_pack(w.data_ptr(), N, K, packed.data_ptr())
    weight._invariant_packed = (weight._version, packed)
    return packed


def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """(..., K) x (N, K) -> (..., N), fp32 on CPU, each output one FMA chain over k."""
    N, K = weight.shape
    if x.shape[-1] != K or x.dtype is not torch.float32 or weight.dtype is not torch.float32:
        raise ValueError(f"invariant gemm takes fp32 (..., {K}) x ({N}, {K}), got {x.dtype} {tuple(x.shape)} x "
                         f"{weight.dtype} {tuple(weight.shape)}")
    if x.device.type != "cpu" or weight.device.type != "cpu" or (bias is not None and bias.shape != (N,)):
        raise ValueError(f"invariant gemm takes CPU tensors and a bias of the weight's {N} outputs, got x on "
                         f"{x.device}, weight on {weight.device}, bias {None if bias is None else tuple(bias.shape)}")
    packed = pack(weight)
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=torch.float32)
    if bias is not None:
        bias = bias.detach().float().contiguous()
    if M:
        _libs("gemm").invariant_gemm(x2.data_ptr(), x2.stride(0), packed.data_ptr(),
                                     None if bias is None else bias.data_ptr(), y.data_ptr(), M, K, N,
                                     torch.get_num_threads())
    return y.reshape(*x.shape[:-1], N)


def reference_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The pure-PyTorch reference of ``gemm``: the product in float64, rounded to fp32."""
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double()).float()


def _check_attention(q, k_store, v_store, slot_stride, head_stride, slots, slot_offsets, token_offsets, cached,
                     num_kv_heads) -> None:
    """Raise ``ValueError`` naming the problem before ``invariant_attention`` reads past a tensor's end."""
    if q.dim() != 3 or q.dtype is not torch.float32 or k_store.dtype is not torch.float32 \
            or v_store.dtype is not torch.float32:
        raise ValueError(f"invariant attention takes fp32 q (N, H, D) and K/V stores, got q {q.dtype} "
                         f"{tuple(q.shape)}, K {k_store.dtype}, V {v_store.dtype}")
    N, H, D = q.shape
    for t in (k_store, v_store):
        if not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError("the K/V stores must be contiguous CPU tensors (strides are given in elements)")
    idx = {"slots": slots, "slot_offsets": slot_offsets, "token_offsets": token_offsets, "cached": cached}
    for name, t in idx.items():
        if t.dtype is not torch.int64 or t.dim() != 1 or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"invariant attention: {name} must be a contiguous int64 CPU vector, got {t.dtype} "
                             f"{tuple(t.shape)}")
    B = cached.numel()
    if num_kv_heads < 1 or H % num_kv_heads or slot_offsets.numel() != B + 1 or token_offsets.numel() != B + 1:
        raise ValueError(f"invariant attention: {H} query heads over {num_kv_heads} KV heads, {B} sequences with "
                         f"{slot_offsets.numel()} slot offsets and {token_offsets.numel()} token offsets "
                         "(each must be sequences + 1)")
    if B and (int(token_offsets[-1]) != N or int(slot_offsets[-1]) > slots.numel()
              or bool((slot_offsets[1:] - slot_offsets[:-1] < token_offsets[1:] - token_offsets[:-1]
                       + cached).any())):
        raise ValueError("invariant attention: the offsets do not cover the queries, or a sequence has fewer key "
                         "slots than its cached tokens plus its queries")
    last = (int(slots.max()) * slot_stride + (num_kv_heads - 1) * head_stride + D) if slots.numel() else 0
    if slots.numel() and (int(slots.min()) < 0 or last > min(k_store.numel(), v_store.numel())):
        raise ValueError(f"invariant attention: a key slot reaches element {last} of stores of "
                         f"{min(k_store.numel(), v_store.numel())}")


def attention(q: torch.Tensor, k_store: torch.Tensor, v_store: torch.Tensor, slot_stride: int, head_stride: int,
              slots: torch.Tensor, slot_offsets: torch.Tensor, token_offsets: torch.Tensor, cached: torch.Tensor,
              num_kv_heads: int) -> torch.Tensor:
    """Causal attention of a ragged batch; returns (N, H, D) contiguous.

    q: (N, H, D) with unit stride on D (any token/head strides). k_store, v_store: the K/V memory;
    slot p of KV head g starts at element ``p * slot_stride + g * head_stride``. Sequence i owns query
    tokens ``token_offsets[i]:token_offsets[i+1]`` at positions ``cached[i] + j`` and key slots
    ``slots[slot_offsets[i]:slot_offsets[i+1]]`` in position order; query j sees keys 0..cached[i]+j.
    Index tensors are int64 CPU and contiguous."""
    N, H, D = q.shape
    _check_attention(q, k_store, v_store, slot_stride, head_stride, slots, slot_offsets, token_offsets, cached,
                     num_kv_heads)
    if q.stride(2) != 1:
        q = q.contiguous()
    out = torch.empty(N, H, D, dtype=torch.float32)
    B = int(cached.numel())
    if N:
        _libs("attention").invariant_attention(
            q.data_ptr(), q.stride(0), q.stride(1), k_store.data_ptr(), v_store.data_ptr(), slot_stride, head_stride,
            slots.data_ptr(), slot_offsets.data_ptr(), token_offsets.data_ptr(), cached.data_ptr(), B, H,
            num_kv_heads, D, float(D) ** -0.5, out.data_ptr(), torch.get_num_threads())
    return out


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """The dense cache's case: q (B, H, n, D) at positions start..start+n-1; k, v (B, Hkv, S, D) the
    whole cache buffers (S >= start + n). Returns (B, H, n, D) (a view of a (B, n, H, D) tensor)."""
    B, H, n, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    L = start + n
    # Batch row b is a sequence whose slot p is element offset (b * Hkv * S + p) * D.
    slots = (torch.arange(B)[:, None] * (Hkv * S) + torch.arange(L)[None]).reshape(-1)
    slot_off = torch.arange(B + 1) * L
    tok_off = torch.arange(B + 1) * n
    cached = torch.full((B,), start, dtype=torch.long)
    qf = q.transpose(1, 2).reshape(B * n, H, D)  # (B*n, H, D), token-major
    out = attention(qf, k, v, D, S * D, slots, slot_off, tok_off, cached, Hkv)
    return out.view(B, n, H, D).transpose(1, 2)


def dense_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """The pure-PyTorch reference of ``dense_attention``: causal attention in float64 over the cache's first
    ``start + n`` slots, each query head reading its group's key/value head, rounded to fp32."""
    B, H, n, D = q.shape
    Hkv = k.shape[1]
    L = start + n
    kk = k[:, :, :L].double().repeat_interleave(H // Hkv, dim=1)
    vv = v[:, :, :L].double().repeat_interleave(H // Hkv, dim=1)
    scores = q.double() @ kk.transpose(-1, -2) / D ** 0.5  # (B, H, n, L)
    pos = torch.arange(L)[None] <= (start + torch.arange(n))[:, None]
    scores = scores.masked_fill(~pos, float("-inf"))
    return (scores.softmax(-1) @ vv).float()
