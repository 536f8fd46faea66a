"""The contiguous KV cache: preallocated, rollback-able, with optional tree masks and padding.

One ``DenseKVCache`` holds ``batch`` sequences of equal slot count. ``begin(n)`` opens a forward of
``n`` new tokens per sequence at slots [length, length + n); ``truncate(m)`` rolls back to ``m``
slots (speculative rejection); ``keep(slots)`` compacts chosen slots after a tree verification.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from studylib.errors import StudylibError
from studylib.models import invariant
from studylib.models.config import ModelConfig


class DenseKVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        batch: int,
        max_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        if max_len > cfg.max_position_embeddings:
            raise StudylibError(
                f"a cache of {max_len} tokens exceeds the model's context window of "
                f"{cfg.max_position_embeddings}; shorten the prompt or --max-new-tokens."
            )
        shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.batch, self.max_len, self.length = batch, max_len, 0
        self.device = torch.device(device)
        # valid[b, s]: slot s of sequence b holds a real token (False for left padding).
        self.valid = torch.ones(batch, max_len, dtype=torch.bool, device=device)
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=device)
        self.padded = False
        self._start = 0
        self._n = 0
        self._pos: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self._causal = False
        self._plain = False
        self.mask_fn = None  # optional (q_pos, k_pos) -> bool mask, set by sparse attention patterns

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for store in self._slot_stores() for t in store)

    def _slot_stores(self) -> tuple[list[torch.Tensor], ...]:
        """Per-layer tensors indexed by slot on dim 2 (what ``keep`` moves); subclasses that store more
        per slot (``kvcache.int8``'s scales) add theirs."""
        return self.k, self.v

    def begin(
        self,
        n: int,
        tree_mask: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> DenseKVCache:
        """Open a forward over ``n`` new tokens.

        tree_mask: (n, n) bool, which new tokens see which (default causal). The prefix is always
        visible. valid: (batch, n) bool, False marks padding. positions: (batch, n) override, e.g.
        ``length + depth`` for token trees.
        """
        s = self.length
        if s + n > self.max_len:
            raise StudylibError(
                f"the KV cache holds {self.max_len} tokens but this step needs {s + n}; "
                "raise max_len (prompt + max_new_tokens + draft slack) or shorten the request."
            )
        self._start, self._n = s, n
        dev = self.device
        if valid is not None:
            self.valid[:, s : s + n] = valid
            self.padded = self.padded or not bool(valid.all())
        else:
            self.valid[:, s : s + n] = True
        if positions is None:
            if self.padded:
                steps = torch.cumsum(self.valid[:, s : s + n].long(), dim=1) - 1
                positions = (self.next_pos[:, None] + steps).clamp_min(0)
            else:
                positions = self.next_pos[:, None] + torch.arange(n, device=dev)[None]
        self._pos = positions
        new_valid = self.valid[:, s : s + n].long().sum(1)
        self.next_pos = self.next_pos + (new_valid if self.padded else n)

        self._causal = False
        # Plain causal attention (query j sees slots 0..s+j): what the batch-invariant kernel computes.
        self._plain = tree_mask is None and not self.padded and self.mask_fn is None
        if tree_mask is None and not self.padded and self.mask_fn is None and (s == 0 or n == 1):
            # Fast paths: a fresh causal prefill, or a single decode token that sees everything.
            # (n > 1 new tokens after a prefix need the explicit causal mask below: SDPA's is_causal
            # aligns the triangle top-left, which would hide the prefix.)
            self._mask = None
            self._causal = s == 0 and n > 1
        else:
            local = tree_mask if tree_mask is not None else torch.ones(n, n, dtype=torch.bool, device=dev).tril()
            mask = torch.cat([torch.ones(n, s, dtype=torch.bool, device=dev), local.to(dev)], dim=1)
            mask = mask[None].expand(self.batch, n, s + n)
            if self.mask_fn is not None:
                kpos = self.slot_positions(s + n)
                mask = mask & self.mask_fn(positions, kpos)
            if self.padded:
                mask = mask & self.valid[:, None, : s + n]
                # A padding query would see nothing; let it see itself so SDPA has no empty row
                # (after mask_fn, which hides padding slots and would empty that row again).
                eye = torch.zeros(n, s + n, dtype=torch.bool, device=dev)
                eye[:, s:] = torch.eye(n, dtype=torch.bool, device=dev)
                mask = mask | eye
            self._mask = mask[:, None]  # (B, 1, n, s + n)
        self.length = s + n
        return self

    def slot_positions(self, upto: int) -> torch.Tensor:
        """Position id held by each slot (batch, upto); padding slots get -1."""
        pos = torch.cumsum(self.valid[:, :upto].long(), dim=1) - 1
        return pos.masked_fill(~self.valid[:, :upto], -1)

    def positions(self) -> torch.Tensor:
        return self._pos

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s, n = self._start, self._n
        self.k[layer][:, :, s : s + n] = k
        self.v[layer][:, :, s : s + n] = v
        if self._plain and invariant.applies(q, self.k[layer]):
            return invariant.dense_attention(q, self.k[layer], self.v[layer], s)
        keys, vals = self.k[layer][:, :, : s + n], self.v[layer][:, :, : s + n]
        return F.scaled_dot_product_attention(
            q, keys, vals, attn_mask=self._mask, is_causal=self._causal, enable_gqa=True
        )

    def truncate(self, length: int) -> None:
        """Roll back to the first ``length`` slots (rejected speculative tokens vanish)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        if self.padded:
            self.next_pos = self.valid[:, :length].long().sum(1)
        else:
            self.next_pos = torch.full_like(self.next_pos, length)
        self.length = length

    def keep(self, start: int, slots: list[int] | torch.Tensor) -> None:
        """Keep slots ``slots`` (absolute, ascending) as the tokens right after ``start``.

        After a tree or n-gram verification the accepted tokens sit at scattered slots; this moves
        them next to the prefix so the cache again equals a plain prefill of the accepted text.
        """
        idx = torch.as_tensor(slots, dtype=torch.long, device=self.device)
        m = int(idx.numel())
        for store in self._slot_stores():
            for t in store:
                t[:, :, start : start + m] = t.index_select(2, idx)
        self.truncate(start + m)
