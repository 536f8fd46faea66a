"""The PyTorch backend: the dense reference, masked SDPA, and a gather-based sparse attention.

``attention_ref`` materialises the full (Tq, Tk) mask: quadratic by construction, the ground truth
every kernel is tested against. ``sparse_attention`` does the work a sparse pattern promises: it
cuts the queries into chunks and, for each chunk, gathers only the keys the pattern can reach
(the sinks plus a band of W + C - 1 keys, or the chunk's live blocks), then runs one batched SDPA
over all chunks. Work and memory are O(Tq * (S + W + C)) instead of O(Tq * Tk).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from studylib.attention.patterns import BlockSparse, Dense, Pattern

# Chunks are processed in groups holding about this many (query, key) score entries per batch*head.
_GROUP_ELEMS = 1 << 22


def attention_ref(q, k, v, pattern: Pattern, upcast: bool = True) -> torch.Tensor:
    """Dense masked attention over the full mask. upcast=True computes in fp32 (the reference);
    upcast=False keeps q/k/v's dtype for the matmuls, as a plain PyTorch port would."""
    Tq, Tk = q.shape[2], k.shape[2]
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)  # (B, H, Tk, D)
    v = v.repeat_interleave(g, dim=1)
    pos = torch.arange(Tk, device=q.device)
    mask = pattern.mask(pos[Tk - Tq:], pos)  # (Tq, Tk)
    scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5  # (B, H, Tq, Tk)
    scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # empty rows -> 0, by definition
    return (p.to(v.dtype) @ v).to(dtype)


def masked_sdpa(q, k, v, pattern: Pattern) -> torch.Tensor:
    """Fused SDPA with the pattern as a boolean mask: exact, but still quadratic work."""
    Tq, Tk = q.shape[2], k.shape[2]
    pos = torch.arange(Tk, device=q.device)
    mask = pattern.mask(pos[Tk - Tq:], pos)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return _zero_empty_rows(out, mask)


def dense_sdpa(q, k, v) -> torch.Tensor:
    """Dense causal attention with queries at the last Tq positions (SDPA's fast causal path)."""
    Tq, Tk = q.shape[2], k.shape[2]
    if Tq == Tk or Tq == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=Tq > 1, enable_gqa=True)
    return masked_sdpa(q, k, v, Dense())


def sparse_attention(
    q, k, v, pattern: Pattern, q_pos: torch.Tensor | None = None, k_pos: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Gather-based sparse attention. q (B, H, Tq, D), k/v (B, Hkv, Tk, D).

    q_pos (Tq,) and k_pos (Tk,) are ascending positions shared by the batch; by default the keys
    are 0..Tk-1 and the queries the last Tq of them. Gaps are allowed (a sink cache holds the
    first S and the last W positions only). Block-sparse patterns need the default positions.
    """
    if isinstance(pattern, Dense) and q_pos is None and k_pos is None:
        return dense_sdpa(q, k, v)
    Tq, Tk = q.shape[2], k.shape[2]
    dev = q.device
    default_pos = q_pos is None and k_pos is None
    if k_pos is None:
        k_pos = torch.arange(Tk, device=dev)
    if q_pos is None:
        q_pos = torch.arange(Tk - Tq, Tk, device=dev)
    if isinstance(pattern, BlockSparse):
        if not default_pos:
            raise ValueError("block-sparse attention is defined on contiguous positions 0..Tk-1")
        shift, k_idx = _block_plan(pattern, Tq, Tk)
        C = pattern.block
    else:
        C = chunk or default_chunk(pattern)
        shift, k_idx = 0, _window_plan(pattern, q_pos.cpu(), k_pos.cpu(), C)
    return _gather_attention(q, k, v, pattern, shift, C, k_idx.to(dev), q_pos, k_pos)


def default_chunk(pattern: Pattern) -> int:
    """Query chunk for window/sink plans: smaller chunks waste fewer keys (a chunk reads W + C - 1)
    but make more, smaller matmuls; W/4 clamped to [16, 128] measured well on CPU."""
    if not pattern.window:
        return 128
    return max(16, min(128, pattern.window // 4))


def _window_plan(pattern: Pattern, q_pos: torch.Tensor, k_pos: torch.Tensor, chunk: int) -> torch.Tensor:
    """Key indices (nC, L) each chunk of ``chunk`` consecutive queries can reach, -1 where unused:
    the sinks (positions < S), then the band from the chunk's first query - W + 1 to its last."""
    Tq = q_pos.numel()
    W, S = pattern.window or 1 << 62, pattern.sinks
    nC = -(-Tq // chunk)
    starts = torch.arange(0, Tq, chunk)
    first = q_pos[starts]
    last = q_pos[(starts + chunk - 1).clamp(max=Tq - 1)]
    ns = int(torch.searchsorted(k_pos, torch.tensor(S)))  # keys with position < S
    lo = torch.searchsorted(k_pos, (first - W + 1).clamp(min=0)).clamp(min=ns)
    hi = torch.searchsorted(k_pos, last, right=True)
    width = int((hi - lo).clamp(min=0).max())
    band = lo[:, None] + torch.arange(width)[None]
    band = torch.where(band < hi[:, None], band, -1)
    sinks = torch.arange(ns)[None].expand(nC, ns)
    return torch.cat([sinks, band], dim=1)


@functools.lru_cache(maxsize=64)
def _block_plan(pattern: BlockSparse, Tq: int, Tk: int) -> tuple[int, torch.Tensor]:
    """Chunks are the pattern's query blocks; each gathers the key blocks its layout row names.
    Returns (shift, k_idx): chunk c holds query rows c*B - shift .. c*B - shift + B - 1."""
    B = pattern.block
    nb = -(-Tk // B)
    first_block = (Tk - Tq) // B
    lay = pattern.layout(nb)[first_block:]  # (nQB, nb)
    count = lay.sum(1)
    width = int(count.max())
    # Live key blocks of each row, first, ordered by index; -1 padding after them.
    order = torch.argsort((~lay).to(torch.int8), dim=1, stable=True)[:, :width]
    blocks = torch.where(torch.arange(width)[None] < count[:, None], order, -1)
    keys = blocks[:, :, None] * B + torch.arange(B)[None, None]
    keys = torch.where((blocks[:, :, None] >= 0) & (keys < Tk), keys, -1)
    return (Tk - Tq) - first_block * B, keys.reshape(lay.shape[0], width * B)


def _gather_attention(q, k, v, pattern, shift, C, k_idx, q_pos, k_pos) -> torch.Tensor:
    """Queries in consecutive chunks of C rows (after ``shift`` padding rows); chunk c attends to
    the keys k_idx[c] (-1 = none) under the pattern's token-level mask."""
    B, H, Tq, D = q.shape
    Hkv = k.shape[1]
    nC, L = k_idx.shape
    pad_back = nC * C - shift - Tq
    qp_all = F.pad(q_pos, (shift, pad_back), value=-1).view(nC, C)
    qpad = F.pad(q, (0, 0, shift, pad_back)).view(B, H, nC, C, D)
    out = q.new_empty(B, H, nC, C, D)
    step = max(1, _GROUP_ELEMS // max(1, C * L))
    for c0 in range(0, nC, step):
        ki = k_idx[c0: c0 + step]  # (n, L)
        n = ki.shape[0]
        kp = torch.where(ki >= 0, k_pos[ki.clamp(min=0)], -1)
        qp = qp_all[c0: c0 + n]
        mask = pattern.mask(qp, kp)  # (n, C, L)
        mask[:, :, 0] |= qp < 0  # padding rows (dropped below) see one key, so SDPA makes no NaN there
        # (B, heads, n, rows, D) -> (B*n, heads, rows, D): every chunk becomes a batch entry.
        qg = qpad[:, :, c0: c0 + n].transpose(1, 2).reshape(B * n, H, C, D)
        kg = k[:, :, ki.clamp(min=0)].transpose(1, 2).reshape(B * n, Hkv, L, D)
        vg = v[:, :, ki.clamp(min=0)].transpose(1, 2).reshape(B * n, Hkv, L, D)
        m = mask[None].expand(B, n, C, L).reshape(B * n, 1, C, L)
        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=m, enable_gqa=True)  # (B*n, H, C, D)
        out[:, :, c0: c0 + n] = _zero_empty_rows(o, m).view(B, n, H, C, D).transpose(1, 2)
    return out.view(B, H, nC * C, D)[:, :, shift: shift + Tq]


def _zero_empty_rows(out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SDPA returns NaN for a row with no visible key; the contract says 0."""
    empty = ~mask.any(-1)  # (..., Tq)
    if bool(empty.any()):
        out = out.masked_fill(empty[..., None], 0.0)
    return out
