"""``PagedBatch``: the runtime's KV view over a ragged batch of sequences in a ``PagedKVPool``.

The batch is flattened into one row: ``input_ids`` is (1, sum_i n_i), sequence i contributing its
n_i new tokens, which sit at positions [c_i, c_i + n_i) after its c_i tokens already in the pool.
``attend`` writes the new K/V into the slots the block tables name, then each sequence attends to
its own cached prefix (fully) and to its new tokens (causally). The only per-step copy is the gather
of each sequence's own keys and values; a sequence whose blocks happen to be consecutive in the
pool (a fresh allocation usually is) is read in place as a view, with no copy at all.

Two attention strategies, same arithmetic per sequence up to padding:
- ``loop``: one SDPA per sequence over exactly its keys (best for prefill: no padding waste).
- ``padded``: gather every sequence into (B, Hkv, max_len, D) and run one SDPA with a key-padding
  mask (meant for decode-heavy batches on GPUs, where a loop of B tiny SDPAs is B kernel launches).
- ``kernel``: one C call per layer for the whole batch (``models.invariant.attention``): each query's
  softmax over exactly its keys, read through the block tables in place, with a fixed reduction
  order, so a token's output does not depend on the batch (fp32 CPU, no ``mask_fn``).
``auto`` picks ``kernel`` where it applies (fp32 on CPU without a sparse pattern): a saturated decode
step of 64 sequences otherwise spends more time in 64 x 30 small SDPA calls and their gathers than in
the kernel. Of the two SDPA strategies, ``loop`` measured faster on CPU in every case we tried (smollm2-135m shapes,
one layer, 1 thread: B=8 x 512 cached, 1 new: 14 ms vs 20 ms; B=32 x 256, 1 new: 25 vs 51 ms;
B=4 x 256, 64 new: 34 vs 35 ms): the masked SDPA falls off the fast kernel and the padded gather
costs more than the loop saves. On CUDA, where each small SDPA is a kernel launch, ``auto`` picks
``padded`` for batches of more than one sequence that each bring at most ``padded_max_new`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from studylib.kvcache.pool import PagedKVPool
from studylib.models import invariant

# The DenseKVCache.mask_fn signature: (q_pos (1, n), k_pos (1, L)) -> bool mask broadcastable to (1, n, L).
MaskFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class PagedBatch:
    def __init__(
        self,
        pool: PagedKVPool,
        block_tables: Sequence[Sequence[int]],
        cached_lens: Sequence[int],
        new_lens: Sequence[int],
        *,
        mode: str = "auto",
        mask_fn: MaskFn | None = None,
        padded_max_new: int = 1,
    ):
        if not (len(block_tables) == len(cached_lens) == len(new_lens)) or not block_tables:
            raise ValueError("block_tables, cached_lens and new_lens must be non-empty and of equal length")
        if mode not in ("auto", "loop", "padded", "kernel"):
            raise ValueError(f"unknown PagedBatch mode {mode!r}; use auto, loop, padded or kernel")
        self.pool = pool
        self.tables = [list(t) for t in block_tables]
        self.cached = [int(c) for c in cached_lens]
        self.new = [int(n) for n in new_lens]
        if min(self.new) < 1 or min(self.cached) < 0:
            raise ValueError(f"every sequence needs >= 1 new token and >= 0 cached: {self.cached}, {self.new}")
        self.mask_fn = mask_fn
        dev = pool.device
        self.total = [c + n for c, n in zip(self.cached, self.new, strict=True)]
        self.offsets = [0]
        for n in self.new:
            self.offsets.append(self.offsets[-1] + n)
        self.num_tokens = self.offsets[-1]
        kernel_ok = mask_fn is None and pool.device.type == "cpu" and pool.dtype == torch.float32
        if mode == "kernel" and not kernel_ok:
            raise ValueError("the kernel strategy takes an fp32 CPU pool and no mask_fn")
        if mode == "auto" or (invariant.active() and kernel_ok):
            decode_heavy = len(self.new) > 1 and max(self.new) <= padded_max_new
            if kernel_ok and (invariant.active() or invariant.available()[0]):
                mode = "kernel"
            else:
                mode = "padded" if decode_heavy and pool.device.type == "cuda" else "loop"
        self.mode = mode

        # (1, N) absolute positions, and the slots the new tokens are written to (N,).
        self._pos = torch.cat([torch.arange(c, c + n) for c, n in zip(self.cached, self.new, strict=True)])
        self._pos = self._pos.to(dev)[None]
        self._write = torch.cat([
            pool.slots(t, c, c + n) for t, c, n in zip(self.tables, self.cached, self.new, strict=True)
        ])
        if self.mode == "kernel":
            self._build_kernel()
            return
        # Per-sequence read slots [0, c_i + n_i) (gathered per layer).
        self._read = [pool.slots(t, 0, L) for t, L in zip(self.tables, self.total, strict=True)]
        # First slot of a sequence stored in consecutive blocks (read as a view), else None (gather).
        self._span = [t[0] * pool.block_size if t == list(range(t[0], t[0] + len(t))) else None
                      for t in self.tables]
        self._masks = [self._seq_mask(c, n) for c, n in zip(self.cached, self.new, strict=True)]
        if self.mode == "padded":
            self._build_padded()

    # ---- the KV-view interface ------------------------------------------------------------------
    def positions(self) -> torch.Tensor:
        return self._pos

    def logit_index(self) -> torch.Tensor:
        """Flat index (B,) of each sequence's last new token, for ``model(ids, view, logits=idx)``."""
        return torch.tensor([o - 1 for o in self.offsets[1:]], dtype=torch.long, device=self.pool.device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (1, H, N, D); k, v (1, Hkv, N, D) for the flattened new tokens -> (1, H, N, D)."""
        ks, vs = self.pool.k_slots(layer), self.pool.v_slots(layer)  # (num_slots, Hkv, D)
        ks.index_copy_(0, self._write, k[0].transpose(0, 1).to(ks.dtype))
        vs.index_copy_(0, self._write, v[0].transpose(0, 1).to(vs.dtype))
        if self.mode == "kernel":
            qf = q[0].transpose(0, 1)  # (N, H, D), a view
            out = invariant.attention(qf, ks, vs, ks.stride(0), ks.stride(1), self._k_slots, self._k_slot_off,
                                      self._k_tok_off, self._k_cached, ks.shape[1])
            return out.transpose(0, 1)[None]  # (1, H, N, D)
        if self.mode == "padded":
            return self._attend_padded(q, ks, vs)
        outs = []
        for i, (c, n) in enumerate(zip(self.cached, self.new, strict=True)):
            o0, o1 = self.offsets[i], self.offsets[i + 1]
            qi = q[:, :, o0:o1]  # (1, H, n, D)
            if c == 0:
                # Nothing cached: the new k, v are the whole sequence, no gather needed.
                ki, vi = k[:, :, o0:o1], v[:, :, o0:o1]
            elif self._span[i] is not None:
                a = self._span[i]
                ki = ks[a : a + c + n].transpose(0, 1)[None]  # (1, Hkv, c + n, D), a view
                vi = vs[a : a + c + n].transpose(0, 1)[None]
            else:
                idx = self._read[i]
                ki = ks.index_select(0, idx).transpose(0, 1)[None]  # (1, Hkv, c + n, D), a copy
                vi = vs.index_select(0, idx).transpose(0, 1)[None]
            mask = self._masks[i]
            causal = mask is None and c == 0 and n > 1
            outs.append(F.scaled_dot_product_attention(
                qi, ki, vi, attn_mask=mask, is_causal=causal, enable_gqa=True))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def kernel_slots(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(token offsets, cached lengths, every sequence's key slots in position order, their offsets),
        int64 CPU tensors: how a C kernel addresses this batch in the pool (the fused decode step)."""
        if not hasattr(self, "_k_slots"):
            self._build_kernel()
        return self._k_tok_off, self._k_cached, self._k_slots, self._k_slot_off

    # ---- helpers --------------------------------------------------------------------------------
    def _build_kernel(self) -> None:
        """Flat key slots of every sequence, in position order, and the offsets the kernel reads."""
        bs = self.pool.block_size
        parts = []
        for table, length in zip(self.tables, self.total, strict=True):
            pos = np.arange(length)
            parts.append(np.asarray(table, dtype=np.int64)[pos // bs] * bs + pos % bs)
        self._k_slots = torch.from_numpy(np.concatenate(parts))
        self._k_slot_off = torch.tensor([0, *np.cumsum(self.total)], dtype=torch.long)
        self._k_tok_off = torch.tensor(self.offsets, dtype=torch.long)
        self._k_cached = torch.tensor(self.cached, dtype=torch.long)

    def _seq_mask(self, c: int, n: int) -> torch.Tensor | None:
        """(n, c + n) bool mask for one sequence, or None where SDPA's defaults are exact."""
        if self.mask_fn is None and (n == 1 or c == 0):
            return None  # one query sees everything; or a fresh causal prefill (is_causal)
        dev = self.pool.device
        qpos = torch.arange(c, c + n, device=dev)
        kpos = torch.arange(c + n, device=dev)
        mask = kpos[None, :] <= qpos[:, None]
        if self.mask_fn is not None:
            mask = mask & self._pattern(qpos, kpos)
        return mask

    def _pattern(self, qpos: torch.Tensor, kpos: torch.Tensor) -> torch.Tensor:
        return self.mask_fn(qpos[None], kpos[None]).reshape(len(qpos), len(kpos))

    def _build_padded(self) -> None:
        dev = self.pool.device
        B, L, nmax = len(self.new), max(self.total), max(self.new)
        read = torch.zeros(B, L, dtype=torch.long, device=dev)
        qidx = torch.zeros(B, nmax, dtype=torch.long, device=dev)
        mask = torch.zeros(B, 1, nmax, L, dtype=torch.bool, device=dev)
        valid_q = []
        kpos = torch.arange(L, device=dev)
        for i, (c, n) in enumerate(zip(self.cached, self.new, strict=True)):
            read[i, : c + n] = self._read[i]
            qidx[i, :n] = torch.arange(self.offsets[i], self.offsets[i + 1], device=dev)
            qpos = torch.arange(c, c + nmax, device=dev)
            m = kpos[None, :] <= qpos[:, None]  # causal, which also hides the padded keys past c + n
            if self.mask_fn is not None:
                m[:n, : c + n] &= self._pattern(qpos[:n], kpos[: c + n])
            mask[i, 0] = m
            valid_q.append(i * nmax + torch.arange(n, device=dev))
        self._pad_read, self._pad_q, self._pad_mask = read, qidx, mask
        self._pad_valid = torch.cat(valid_q)
        self._pad_shape = (B, L, nmax)

    def _attend_padded(self, q: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor) -> torch.Tensor:
        B, L, nmax = self._pad_shape
        H, D = q.shape[1], q.shape[3]
        Hkv = ks.shape[1]
        keys = ks[self._pad_read.reshape(-1)].view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        vals = vs[self._pad_read.reshape(-1)].view(B, L, Hkv, D).transpose(1, 2)
        qb = q[0][:, self._pad_q.reshape(-1)].view(H, B, nmax, D).transpose(0, 1)  # (B, H, nmax, D)
        out = F.scaled_dot_product_attention(qb, keys, vals, attn_mask=self._pad_mask, enable_gqa=True)
        out = out.transpose(0, 1).reshape(H, B * nmax, D)[:, self._pad_valid]  # (H, N, D)
        return out[None]
