"""``attention(q, k, v, pattern, backend)``: one entry point, backends chosen by name.

Backends import lazily so this package imports without Triton or a GPU; asking for one that
cannot run here raises ``StudylibError`` rather than quietly running another.
"""

from __future__ import annotations

import torch

from studylib.attention.patterns import Pattern
from studylib.errors import StudylibError

BACKENDS = {
    "torch": "dense: SDPA causal; sparse patterns: gather-based, O(n * budget) work",
    "masked": "SDPA with the pattern as a dense boolean mask: exact but quadratic (the baseline)",
    "triton": "FlashAttention-style Triton kernels that skip masked key tiles (CUDA, or TRITON_INTERPRET=1)",
    "cuda": "hand-written CUDA C++ kernels, JIT-built with torch.utils.cpp_extension (CUDA only)",
}


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Shapes: q (B, H, Tq, D), k and v (B, Hkv, Tk, D) with H % Hkv == 0 and 1 <= Tq <= Tk."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise StudylibError(
            f"attention wants q (B, H, Tq, D) and k, v (B, Hkv, Tk, D); got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}."
        )
    B, H, Tq, D = q.shape
    if k.shape[0] != B or k.shape[3] != D or H % k.shape[1]:
        raise StudylibError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree: batch and head_dim must match and the "
            "query heads must be a multiple of the KV heads (GQA)."
        )
    if not 1 <= Tq <= k.shape[2]:
        raise StudylibError(f"need 1 <= q_len <= kv_len (queries are the last positions); got {Tq} > {k.shape[2]}.")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise StudylibError(f"q, k, v must share one floating dtype; got {q.dtype}, {k.dtype}, {v.dtype}.")
    if not (q.device == k.device == v.device):
        raise StudylibError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}.")


def attention(q, k, v, pattern: Pattern | str = "dense", backend: str = "torch") -> torch.Tensor:
    """Causal attention of q (B, H, Tq, D) over k, v (B, Hkv, Tk, D) under ``pattern``.

    The queries are the last Tq positions (decode and chunked prefill). Returns q's shape and dtype.
    """
    pattern = Pattern.parse(pattern)
    check_qkv(q, k, v)
    if pattern.kind == "quest":  # query-dependent: selection first, then the backend's gathered attention
        from studylib.attention.quest import quest_attention

        return quest_attention(q, k, v, pattern, backend=backend)
    if backend == "torch":
        from studylib.attention.torch_backend import sparse_attention

        return sparse_attention(q, k, v, pattern)
    if backend == "masked":
        from studylib.attention.torch_backend import masked_sdpa

        return masked_sdpa(q, k, v, pattern)
    if backend == "triton":
        from studylib.attention.triton_backend import attention_triton

        return attention_triton(q, k, v, pattern)
    if backend == "cuda":
        from studylib.attention.cuda_backend import attention_cuda

        return attention_cuda(q, k, v, pattern)
    raise StudylibError(f"unknown attention backend {backend!r}; choose one of {sorted(BACKENDS)}.")
