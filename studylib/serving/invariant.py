"""Batch-invariant arithmetic: make every token's result independent of what it is batched with.

Batched inference is not bit-reproducible because the kernels' reduction order depends on the batch
shape: on this CPU, ``F.linear`` over M rows gives rows that differ in the last bits from the same
rows computed alone (M = 1 takes a GEMV path; MKL's GEMM blocking changes with M). Greedy argmax then
flips wherever two logits are nearly tied, so a batched engine and a single-request decoder can
disagree (Thinking Machines, "Defeating nondeterminism in LLM inference").

``batch_invariant(device)`` gives a context in which they cannot:
- on CPU with fp32 weights, ``studylib.models.invariant``'s C kernels (a GEMM with one FMA chain per
  output, and attention with a fixed per-query reduction): as fast as the stock kernels at serving's
  batch sizes, so the engine serves with them by default;
- elsewhere (CUDA, or no C compiler), ``RowByRow``, the pure-PyTorch reference: a
  ``TorchFunctionMode`` that runs ``F.linear`` one row at a time and ``F.scaled_dot_product_attention``
  one query at a time over exactly the keys it may see. It costs a Python loop per row: it proves
  equality, it does not serve.
Everything else in the model is elementwise or a per-row reduction that does not depend on the batch
(checked in tests/test_serving.py). Inside the context the single-request AR decoder and the engine
under any policy, batch size, chunking, prefix hit or preemption compute bit-identical logits.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from studylib.models.cpu_linear import linear


def linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The runtime's linear computed row by row: (..., in) -> (..., out). One row at a time takes the
    same kernel as a single-token decode step (the streaming kernel, or MKL's GEMV without it)."""
    flat = x.reshape(-1, x.shape[-1])  # (M, in)
    rows = [linear(flat[i : i + 1], weight, bias) for i in range(flat.shape[0])]
    out = torch.cat(rows) if rows else flat.new_empty(0, weight.shape[0])
    return out.reshape(*x.shape[:-1], weight.shape[0])


def sdpa_rows(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA one query at a time. q (B, H, T, D); k, v (B, Hkv, S, D); ``attn_mask`` bool, broadcastable
    to (B, 1, T, S). Causal alignment is SDPA's (query t sees keys 0..t)."""
    if dropout_p:
        raise ValueError("batch-invariant attention is for inference; dropout_p must be 0")
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise ValueError("batch-invariant attention supports boolean masks only")
    B, H, T, D = q.shape
    S = k.shape[2]
    if attn_mask is not None:
        mask = attn_mask.expand(B, attn_mask.shape[1], T, S)
        if mask.shape[1] != 1 and not bool((mask == mask[:, :1]).all()):
            raise ValueError("batch-invariant attention needs the same mask for every head")
        mask = mask[:, 0]  # (B, T, S)
    out = torch.empty_like(q)
    for b in range(B):
        for t in range(T):
            if attn_mask is not None:
                idx = mask[b, t].nonzero().flatten()
            else:
                idx = torch.arange(t + 1 if is_causal else S, device=q.device)
            n = int(idx.numel())
            if n and int(idx[-1]) == n - 1:  # a contiguous prefix: slice, which is what AR sees
                kk, vv = k[b : b + 1, :, :n].contiguous(), v[b : b + 1, :, :n].contiguous()
            else:
                kk, vv = k[b : b + 1, :, idx].contiguous(), v[b : b + 1, :, idx].contiguous()
            out[b : b + 1, :, t : t + 1] = F.scaled_dot_product_attention(
                q[b : b + 1, :, t : t + 1].contiguous(), kk, vv, scale=scale, enable_gqa=enable_gqa)
    return out


class RowByRow(TorchFunctionMode):
    """``with RowByRow(): ...`` runs the model with row-by-row linear and query-by-query attention."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            return linear_rows(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            return sdpa_rows(*args, **kwargs)
        return func(*args, **kwargs)


def kernels_apply(device: torch.device | str | None) -> bool:
    """True where ``batch_invariant`` uses the C kernels (CPU, and they compile here)."""
    from studylib.models import invariant

    if os.environ.get("STUDYLIB_INVARIANT_KERNELS", "on").strip().lower() == "off":
        return False  # force the pure-PyTorch reference (tests compare the two)
    return torch.device(device or "cpu").type == "cpu" and invariant.available()[0]


def batch_invariant(device: torch.device | str | None = "cpu"):
    """The batch-invariant context for a model on ``device`` (see the module docstring)."""
    from studylib.models import invariant

    return invariant.enabled() if kernels_apply(device) else RowByRow()
