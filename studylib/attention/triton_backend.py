"""Triton backend: FlashAttention-style prefill and split-K decode kernels that skip masked tiles.

Layout of this file (as in Triton's fused-attention tutorial): the PyTorch reference, the kernels,
then the wrappers that check shapes, dtypes and strides.

Both kernels read a *tile table* built from the pattern on the host (``Pattern.tile_mask``): for
each query tile, the list of key tiles holding any visible pair. The loop visits only those, so a
window of W costs O(W) per query whatever the context length; inside a tile the token-level rule
(causal, window, sinks, block layout) is applied exactly. A row with no visible key outputs 0.

Runs on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before triton was imported
(the interpreter executes the same kernels in numpy: slow, for tests only).
"""

from __future__ import annotations

import functools
import math

import torch

from studylib.attention.patterns import BlockSparse, Pattern, tile_table
from studylib.attention.torch_backend import attention_ref
from studylib.errors import StudylibError

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - triton ships with CUDA builds of torch
    raise StudylibError(
        "the triton backend needs the 'triton' package (pip install triton; it comes with CUDA builds of "
        "torch); use backend='torch' on this machine."
    ) from exc


def attention_triton_ref(q, k, v, pattern: Pattern, upcast: bool = True) -> torch.Tensor:
    """What the kernels compute, in plain PyTorch (the dense masked reference)."""
    return attention_ref(q, k, v, pattern, upcast=upcast)


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------
@triton.jit
def _prefill_kernel(
    Q, K, V, O, TileIdx, TileCnt, Layout,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
    H, G, Tq, Tk, max_tiles, WINDOW, SINKS, LBLOCK, n_lblocks, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, HAS_LAYOUT: tl.constexpr,
    PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // G  # GQA: query head h reads KV head h // G
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    qpos = Tk - Tq + rows  # queries are the last Tq positions
    qpos = tl.where(rows < Tq, qpos, -1)
    d = tl.arange(0, HEAD_D)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + d[None, :], mask=rows[:, None] < Tq, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    Kb = K + b * skb + hk * skh
    Vb = V + b * svb + hk * svh
    n_tiles = tl.load(TileCnt + pid_m)
    for t in range(0, n_tiles):
        kt = tl.load(TileIdx + pid_m * max_tiles + t)
        cols = kt * BLOCK_N + tl.arange(0, BLOCK_N)
        kmask = cols[None, :] < Tk
        k = tl.load(Kb + cols[None, :] * skn + d[:, None], mask=kmask, other=0.0)  # (D, BN)
        v = tl.load(Vb + cols[:, None] * svn + d[None, :], mask=cols[:, None] < Tk, other=0.0)  # (BN, D)
        # Token-level visibility: causal, in range, window or sink, and (block-sparse) the layout.
        vis = (cols[None, :] <= qpos[:, None]) & (cols[None, :] < Tk) & (qpos[:, None] >= 0)
        vis = vis & ((cols[None, :] > qpos[:, None] - WINDOW) | (cols[None, :] < SINKS) | (WINDOW == 0))
        if HAS_LAYOUT:
            qb = tl.maximum(qpos, 0) // LBLOCK
            kb = tl.minimum(cols, Tk - 1) // LBLOCK
            lay = tl.load(Layout + qb[:, None] * n_lblocks + kb[None, :])  # indices clamped in range
            vis = vis & (lay != 0)
        # Online softmax (FlashAttention): fold this tile into the running max m, sum l and acc.
        if DOT_F32:  # the interpreter multiplies bf16 bit patterns as integers: upcast first
            s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee") * qk_scale
        else:
            s = tl.dot(q, k, input_precision=PRECISION) * qk_scale  # (BM, BN), log2 units
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DOT_F32:
            pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # empty rows: acc = 0 -> 0
    tl.store(O + b * sob + h * soh + rows[:, None] * som + d[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None] < Tq)


@triton.jit
def _decode_kernel(
    Q, K, V, Acc, M, L, TileIdx,
    sqb, sqh, skb, skh, skn, svb, svh, svn,
    Hkv, G, Tk, n_tiles, tiles_per_split, n_splits, WINDOW, SINKS, qk_scale,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
    PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):
    """One program = (batch, KV head, split): the G query heads sharing a KV head are the rows of
    one tile (GQA packing), and the split's share of the live key tiles is its loop."""
    pid_bk = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bk // Hkv
    hk = pid_bk % Hkv
    g = tl.arange(0, BLOCK_G)
    heads = hk * G + g
    d = tl.arange(0, HEAD_D)
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + d[None, :], mask=g[:, None] < G, other=0.0)
    qpos = tl.where(g < G, Tk - 1, -1)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_D], tl.float32)
    Kb = K + b * skb + hk * skh
    Vb = V + b * svb + hk * svh
    t0 = split * tiles_per_split
    t1 = tl.minimum(t0 + tiles_per_split, n_tiles)
    for t in range(t0, t1):
        kt = tl.load(TileIdx + t)
        cols = kt * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.load(Kb + cols[None, :] * skn + d[:, None], mask=cols[None, :] < Tk, other=0.0)
        v = tl.load(Vb + cols[:, None] * svn + d[None, :], mask=cols[:, None] < Tk, other=0.0)
        vis = (cols[None, :] <= qpos[:, None]) & (cols[None, :] < Tk) & (qpos[:, None] >= 0)
        vis = vis & ((cols[None, :] > qpos[:, None] - WINDOW) | (cols[None, :] < SINKS) | (WINDOW == 0))
        if DOT_F32:
            s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee") * qk_scale
        else:
            s = tl.dot(q, k, input_precision=PRECISION) * qk_scale  # (BLOCK_G, BN), log2 units
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DOT_F32:
            pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    # Partial results, combined across splits by the wrapper: (B*Hkv, splits, G[, D]).
    base = (pid_bk * n_splits + split) * G
    tl.store(Acc + (base + g[:, None]) * HEAD_D + d[None, :], acc, mask=g[:, None] < G)
    tl.store(M + base + g, m_i, mask=g < G)
    tl.store(L + base + g, l_i, mask=g < G)


@triton.jit
def _quest_decode_kernel(
    Q, K, V, O, Idx,
    sqb, sqh, skb, skh, skn, svb, svh, svn, sob, soh, sib, sih,
    Hkv, G, n_idx, qk_scale,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
    PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):
    """Quest's decode step: one program = (batch, KV head); its G query heads are the rows of one tile
    and it walks the selected key slots (Idx, -1 = skip) in blocks, gathering K and V rows by slot.
    The selection is made on the host (``quest.select_tokens``); this is the read it pays for."""
    pid = tl.program_id(0)
    b = pid // Hkv
    hk = pid % Hkv
    g = tl.arange(0, BLOCK_G)
    heads = hk * G + g
    d = tl.arange(0, HEAD_D)
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + d[None, :], mask=g[:, None] < G, other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_D], tl.float32)
    Kb = K + b * skb + hk * skh
    Vb = V + b * svb + hk * svh
    Ib = Idx + b * sib + hk * sih
    for n0 in range(0, n_idx, BLOCK_N):
        j = n0 + tl.arange(0, BLOCK_N)
        slot = tl.load(Ib + j, mask=j < n_idx, other=-1)
        live = slot >= 0
        safe = tl.where(live, slot, 0)
        k = tl.load(Kb + safe[None, :] * skn + d[:, None], mask=live[None, :], other=0.0)  # (D, BN)
        v = tl.load(Vb + safe[:, None] * svn + d[None, :], mask=live[:, None], other=0.0)  # (BN, D)
        if DOT_F32:
            s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee") * qk_scale
        else:
            s = tl.dot(q, k, input_precision=PRECISION) * qk_scale  # (BLOCK_G, BN), log2 units
        s = tl.where(live[None, :] & (g[:, None] < G), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DOT_F32:
            pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + b * sob + heads[:, None] * soh + d[None, :], out.to(O.dtype.element_ty), mask=g[:, None] < G)


# --------------------------------------------------------------------------------------------------
# Wrappers
# --------------------------------------------------------------------------------------------------
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _interpreted() -> bool:
    return type(_prefill_kernel).__name__ == "InterpretedFunction"


def _check(q, k, v) -> None:
    D = q.shape[-1]
    if q.dtype not in _DTYPES:
        raise StudylibError(f"the triton backend takes float16, bfloat16 or float32, not {q.dtype}.")
    if D < 16 or D > 256 or D & (D - 1):
        raise StudylibError(f"the triton backend needs head_dim a power of two in [16, 256], got {D}.")
    if q.device.type != "cuda" and not _interpreted():
        raise StudylibError(
            "the triton backend needs CUDA tensors; on CPU it runs only under the interpreter "
            "(set TRITON_INTERPRET=1 before triton is first imported). Use backend='torch' here."
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise StudylibError(f"{name} must be contiguous in head_dim (stride(-1) == 1); call .contiguous().")


@functools.lru_cache(maxsize=16)
def _layout(pattern: Pattern, tk: int, device: str) -> tuple[torch.Tensor, int, int]:
    if not isinstance(pattern, BlockSparse):
        return torch.zeros(1, dtype=torch.int8, device=device), 1, 1
    nb = -(-tk // pattern.block)
    return pattern.layout(nb).to(torch.int8).contiguous().to(device), nb, pattern.block


def _meta(q, pattern):
    prec = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32 stays fp32; 16-bit uses tensor cores
    return dict(WINDOW=pattern.window, SINKS=pattern.sinks, qk_scale=q.shape[-1] ** -0.5 * math.log2(math.e),
                PRECISION=prec, DOT_F32=_interpreted() and q.dtype != torch.float32)


def prefill(q, k, v, pattern: Pattern, block_m: int = 64, block_n: int = 64, num_warps: int = 4,
            num_stages: int = 2) -> torch.Tensor:
    """q (B, H, Tq, D), k/v (B, Hkv, Tk, D) -> (B, H, Tq, D) in q's dtype."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    dev = str(q.device)
    idx, cnt, _ = tile_table(pattern, Tq, Tk, block_m, block_n, dev)
    lay, nlb, lblock = _layout(pattern, Tk, dev)
    o = torch.empty_like(q)
    grid = (triton.cdiv(Tq, block_m), B * H)
    extra = {} if _interpreted() else dict(num_warps=num_warps, num_stages=num_stages)
    _prefill_kernel[grid](
        q, k, v, o, idx, cnt, lay,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        H, H // Hkv, Tq, Tk, idx.shape[1], LBLOCK=lblock, n_lblocks=nlb,
        BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, HAS_LAYOUT=isinstance(pattern, BlockSparse),
        **_meta(q, pattern), **extra,
    )
    return o


def decode(q, k, v, pattern: Pattern, block_n: int = 64, splits: int | None = None,
           num_warps: int = 4) -> torch.Tensor:
    """One query token per sequence: q (B, H, 1, D) against k/v (B, Hkv, Tk, D)."""
    B, H, _, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = H // Hkv
    dev = str(q.device)
    if isinstance(pattern, BlockSparse):
        return prefill(q, k, v, pattern, block_m=16, block_n=block_n)  # layout lookups live in prefill
    idx, _, n_tiles = tile_table(pattern, 1, Tk, 1, block_n, dev)
    if splits is None:
        # Enough programs to fill the GPU (~2 per SM on an H100/H200), never an empty split.
        splits = max(1, min(n_tiles, -(-264 // (B * Hkv))))
    splits = max(1, min(splits, max(n_tiles, 1)))
    per = -(-max(n_tiles, 1) // splits)
    splits = -(-max(n_tiles, 1) // per)
    acc = torch.empty(B * Hkv, splits, G, D, device=q.device, dtype=torch.float32)
    m = torch.empty(B * Hkv, splits, G, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    extra = {} if _interpreted() else dict(num_warps=num_warps)
    _decode_kernel[(B * Hkv, splits)](
        q, k, v, acc, m, l, idx,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        Hkv, G, Tk, n_tiles, per, splits,
        BLOCK_G=max(16, triton.next_power_of_2(G)), BLOCK_N=block_n, HEAD_D=D,
        **_meta(q, pattern), **extra,
    )
    # Merge splits: rescale each partial by 2^(m_s - max m) (scores are in log2 units).
    top = m.amax(1, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w = torch.exp2(m - top)  # (B*Hkv, S, G)
    num = (acc * w[..., None]).sum(1)  # (B*Hkv, G, D)
    den = (l * w).sum(1)
    out = num / torch.where(den > 0, den, torch.ones_like(den))[..., None]
    return out.view(B, H, 1, D).to(q.dtype)


def attention_triton(q, k, v, pattern: Pattern) -> torch.Tensor:
    """The backend entry point ``attention(..., backend="triton")`` calls (inputs already checked)."""
    _check(q, k, v)
    if q.shape[2] == 1:
        return decode(q, k, v, pattern)
    return prefill(q, k, v, pattern)


def quest_decode(q, k, v, idx: torch.Tensor, block_n: int = 64, num_warps: int = 4) -> torch.Tensor:
    """Quest's decode attention: q (B, H, 1, D) over the key slots idx (B, Hkv, L) int32 of k/v
    (B, Hkv, T, D), -1 marking slots to skip. Returns (B, H, 1, D) in q's dtype."""
    _check(q, k, v)
    B, H, _, D = q.shape
    Hkv = k.shape[1]
    if idx.shape[:2] != (B, Hkv) or idx.dtype != torch.int32:
        raise StudylibError(f"quest_decode wants idx (B={B}, Hkv={Hkv}, L) int32; got {tuple(idx.shape)} {idx.dtype}.")
    idx = idx.contiguous()
    o = torch.empty(B, H, 1, D, device=q.device, dtype=q.dtype)
    extra = {} if _interpreted() else dict(num_warps=num_warps)
    meta = _meta(q, Pattern())
    _quest_decode_kernel[(B * Hkv,)](
        q, k, v, o, idx,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        o.stride(0), o.stride(1), idx.stride(0), idx.stride(1),
        Hkv, H // Hkv, idx.shape[2], meta["qk_scale"],
        BLOCK_G=max(16, triton.next_power_of_2(H // Hkv)), BLOCK_N=block_n, HEAD_D=D,
        PRECISION=meta["PRECISION"], DOT_F32=meta["DOT_F32"], **extra,
    )
    return o
