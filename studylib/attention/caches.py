"""KV caches that apply a sparse pattern inside the model: the mask version and the evicting one.

- ``PatternKVCache``: a ``DenseKVCache`` (all slots kept) with ``mask_fn`` set to the pattern. Plain
  causal forwards go through ``attention(..., backend)``, so a sparse backend really skips work;
  forwards with tree masks or padding use the parent's masked SDPA, which gives the same numbers.
- ``SinkKVCache``: StreamingLLM's cache policy. It keeps the first S tokens and the last W - 1
  (plus ``slack`` for rollback) and drops the rest, so memory is constant in sequence length.

Positions: both caches keep the keys the model hands them, already rotated by RoPE at their
*original* positions, and queries use original positions too. The two caches therefore compute
exactly the same attention (tested); they differ only in memory. StreamingLLM proper re-assigns
positions inside the cache so it can run past the trained context; here ``make_cache`` is bounded
by the model's context window (``check_lengths``), where original positions are the faithful choice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from studylib.attention.dispatch import attention
from studylib.attention.patterns import Dense, Pattern, Quest, Sinks, Window
from studylib.attention.torch_backend import sparse_attention
from studylib.errors import StudylibError
from studylib.models.config import ModelConfig
from studylib.models.kv import DenseKVCache


class PatternKVCache(DenseKVCache):
    """All slots kept; attention restricted to ``pattern``; plain forwards run on ``backend``."""

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, device, dtype, pattern: Pattern,
                 backend: str = "torch"):
        super().__init__(cfg, batch, max_len, device, dtype)
        self.pattern = pattern
        self.backend = backend
        self.mask_fn = pattern
        self._plain = False

    def begin(self, n, tree_mask=None, valid=None, positions=None):
        plain = (tree_mask is None and positions is None and not self.padded
                 and (valid is None or bool(valid.all())))
        # On the plain path the backend applies the pattern itself: skip building the dense mask.
        self.mask_fn = None if plain else self.pattern
        try:
            super().begin(n, tree_mask=tree_mask, valid=valid, positions=positions)
        finally:
            self.mask_fn = self.pattern
        self._plain = plain
        return self

    def attend(self, layer, q, k, v):
        if not self._plain:
            return super().attend(layer, q, k, v)
        s, n = self._start, self._n
        self.k[layer][:, :, s: s + n] = k
        self.v[layer][:, :, s: s + n] = v
        keys, vals = self.k[layer][:, :, : s + n], self.v[layer][:, :, : s + n]  # (B, Hkv, s+n, D)
        return attention(q, keys, vals, self.pattern, self.backend)


class SinkKVCache:
    """Keeps ``sinks`` first tokens and the last ``window - 1 + slack`` tokens per layer.

    Implements the runtime's KV-view interface (``positions()``, ``attend()``) plus ``begin`` and
    ``truncate`` like ``DenseKVCache``. ``truncate`` can roll back at most ``slack`` tokens beyond
    what the window itself needs; further rollback raises (the tokens are gone).
    """

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, device="cpu", dtype=torch.float32,
                 sinks: int = 4, window: int = 508, slack: int = 0):
        if window < 1 or sinks < 0 or slack < 0:
            raise StudylibError(f"SinkKVCache needs window >= 1, sinks >= 0, slack >= 0; got {window}, {sinks}, {slack}.")
        if max_len > cfg.max_position_embeddings:
            raise StudylibError(
                f"a sequence of {max_len} tokens exceeds the model's context window of "
                f"{cfg.max_position_embeddings}; this cache keeps original positions, so it cannot go past it."
            )
        self.pattern = Sinks(window=window, sinks=sinks)
        self.sinks, self.window, self.slack = sinks, window, slack
        self.keep_recent = window - 1 + slack
        self.batch, self.max_len, self.length = batch, max_len, 0
        self.device, self.dtype = torch.device(device), dtype
        empty = torch.zeros(batch, cfg.num_kv_heads, 0, cfg.head_dim, device=device, dtype=dtype)
        self.k = [empty for _ in range(cfg.num_layers)]  # (B, Hkv, held, D): sinks then recent
        self.v = [empty for _ in range(cfg.num_layers)]
        self.held_pos = torch.zeros(0, dtype=torch.long)  # positions of the held slots, ascending
        self.bytes_per_token = cfg.kv_bytes_per_token(torch.finfo(dtype).bits // 8)
        self._pos = self._kpos = self._next_pos = None
        self._n = 0

    @property
    def nbytes(self) -> int:
        """Bytes held now (K and V, all layers): at most (sinks + window - 1 + slack) tokens' worth."""
        return int(self.held_pos.numel()) * self.bytes_per_token

    @property
    def capacity_tokens(self) -> int:
        return self.sinks + self.keep_recent

    def begin(self, n: int, tree_mask=None, valid=None, positions=None) -> SinkKVCache:
        if tree_mask is not None or positions is not None or (valid is not None and not bool(valid.all())):
            raise StudylibError(
                "SinkKVCache supports plain causal forwards only (no token trees, padding or custom "
                "positions); use make_cache(spec, ..., evict=False) for the mask version."
            )
        if self.length + n > self.max_len:
            raise StudylibError(f"this step reaches {self.length + n} tokens, past max_len={self.max_len}.")
        s = self.length
        new_pos = torch.arange(s, s + n)
        self._n = n
        self._qpos = new_pos.to(self.device)
        self._pos = self._qpos[None].expand(self.batch, n)
        self._kpos = torch.cat([self.held_pos, new_pos]).to(self.device)
        all_pos = torch.cat([self.held_pos, new_pos])
        keep = (all_pos < self.sinks) | (all_pos >= s + n - self.keep_recent)
        self._keep_idx = keep.nonzero().squeeze(1).to(self.device)
        self._next_pos = all_pos[keep]
        # One decode token that sees every held key needs no mask (the common case with slack=0).
        self._see_all = n == 1 and bool(self.pattern.mask(new_pos, self.held_pos).all())
        self.length = s + n
        return self

    def positions(self) -> torch.Tensor:
        return self._pos  # (B, n) original positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys = torch.cat([self.k[layer], k], dim=2)  # (B, Hkv, held + n, D)
        vals = torch.cat([self.v[layer], v], dim=2)
        if self._see_all:
            out = F.scaled_dot_product_attention(q, keys, vals, enable_gqa=True)
        else:
            out = sparse_attention(q, keys, vals, self.pattern, q_pos=self._qpos, k_pos=self._kpos)
        self.k[layer] = keys.index_select(2, self._keep_idx)
        self.v[layer] = vals.index_select(2, self._keep_idx)
        if layer == len(self.k) - 1:
            self.held_pos = self._next_pos
        return out

    def truncate(self, length: int) -> None:
        """Roll back to ``length`` tokens, if the window that length needs is still held."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        need_from = max(self.sinks, length - self.window + 1)
        recent = self.held_pos[self.held_pos >= self.sinks]
        first_recent = int(recent[0]) if recent.numel() else self.length
        if need_from < length and first_recent > need_from:
            raise StudylibError(
                f"cannot roll the sink cache back to {length} tokens: positions {need_from}..{first_recent - 1} "
                f"were evicted; build it with slack >= {self.length - length}."
            )
        keep = self.held_pos < length
        idx = keep.nonzero().squeeze(1).to(self.device)
        self.k = [t.index_select(2, idx) for t in self.k]
        self.v = [t.index_select(2, idx) for t in self.v]
        self.held_pos = self.held_pos[keep]
        self.length = length


def make_cache(spec: str | Pattern, cfg: ModelConfig, max_len: int, device="cpu", dtype=torch.float32,
               batch: int = 1, evict: bool | None = None, backend: str = "torch", slack: int = 0):
    """The KV cache a decoder should use for attention pattern ``spec``.

    dense -> DenseKVCache; window / blocksparse -> PatternKVCache (all slots kept, sparse compute);
    sinks -> SinkKVCache (bounded memory); quest -> QuestKVCache (all slots kept, each decode step
    reads the pages its query needs); int8kv -> Int8KVCache (dense attention, 8-bit storage). ``evict=False`` forces the mask version for sinks;
    ``evict=True`` makes window evict too (a SinkKVCache with 0 sinks). ``backend`` picks the
    attention backend of PatternKVCache: torch (gather), masked (SDPA + mask), triton, cuda.
    """
    pattern = Pattern.parse(spec)
    if isinstance(pattern, Dense):
        return DenseKVCache(cfg, batch, max_len, device, dtype)
    if pattern.kind == "int8kv":
        from studylib.kvcache.int8 import Int8KVCache

        return Int8KVCache(cfg, batch, max_len, device, dtype)
    if isinstance(pattern, Quest):
        if evict:
            raise StudylibError(f"{pattern.spec} keeps every token by design (a later query may need any page); "
                                "it cannot evict.")
        from studylib.attention.quest import QuestKVCache

        return QuestKVCache(cfg, batch, max_len, device, dtype, pattern, "triton" if backend == "triton" else "torch")
    if isinstance(pattern, Sinks | Window) and (evict or (evict is None and isinstance(pattern, Sinks))):
        return SinkKVCache(cfg, batch, max_len, device, dtype, sinks=pattern.sinks, window=pattern.window,
                           slack=slack)
    if evict:
        raise StudylibError(f"{pattern.spec} cannot evict: its random and global blocks reach any earlier token.")
    if backend == "masked":
        cache = DenseKVCache(cfg, batch, max_len, device, dtype)
        cache.mask_fn = pattern
        return cache
    return PatternKVCache(cfg, batch, max_len, device, dtype, pattern, backend)

