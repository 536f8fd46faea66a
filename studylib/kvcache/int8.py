"""A KV cache stored in 8 bits: dense attention, about a quarter of fp32's bytes per token.

Each new key and value vector (one token, one KV head, ``head_dim`` numbers) is stored as int8 with
one fp32 scale, symmetric round-to-nearest (scale = max |x| / 127): ``head_dim + 4`` bytes instead of
``4 * head_dim``. Attention reads the cache back widened to fp32, including the step's own new keys
and values, so what is measured is the model with an 8-bit cache, not a cache that is 8-bit only in
memory. KIVI (Liu et al., ICML 2024) quantises keys per channel and values per token at 2 bits; per
token for both is the simpler choice, and at 8 bits the difference is small (chapter 8 measures the
quality). Pattern spec: ``int8kv`` (``attention.make_cache``, ``--attention int8kv``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from studylib.models.config import ModelConfig
from studylib.models.kv import DenseKVCache


def quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., D) float -> (int8 (..., D), fp32 scale (..., 1)), symmetric round-to-nearest."""
    scale = x.float().abs().amax(-1, keepdim=True) / 127
    q = torch.where(scale > 0, x.float() / scale, torch.zeros_like(x, dtype=torch.float32))
    return q.round().clamp(-127, 127).to(torch.int8), scale


class Int8KVCache(DenseKVCache):
    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, device="cpu", dtype=torch.float32):
        if max_len > cfg.max_position_embeddings:
            DenseKVCache(cfg, batch, max_len)  # raises the usual "exceeds the context window" error
        super().__init__(cfg, batch, 0, device, dtype)  # bookkeeping only; the storage is below
        self.max_len = max_len
        self.valid = torch.ones(batch, max_len, dtype=torch.bool, device=device)
        shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=torch.int8, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=torch.int8, device=device) for _ in range(cfg.num_layers)]
        scale = shape[:-1] + (1,)
        self.k_scale = [torch.zeros(scale, device=device) for _ in range(cfg.num_layers)]
        self.v_scale = [torch.zeros(scale, device=device) for _ in range(cfg.num_layers)]

    def _slot_stores(self):
        return self.k, self.v, self.k_scale, self.v_scale  # nbytes and keep cover the scales too

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s, n = self._start, self._n
        kq, ks = quantise(k)
        vq, vs = quantise(v)
        self.k[layer][:, :, s : s + n], self.k_scale[layer][:, :, s : s + n] = kq, ks
        self.v[layer][:, :, s : s + n], self.v_scale[layer][:, :, s : s + n] = vq, vs
        keys = (self.k[layer][:, :, : s + n].float() * self.k_scale[layer][:, :, : s + n]).to(q.dtype)
        vals = (self.v[layer][:, :, : s + n].float() * self.v_scale[layer][:, :, : s + n]).to(q.dtype)
        return F.scaled_dot_product_attention(q, keys, vals, attn_mask=self._mask, is_causal=self._causal,
                                              enable_gqa=True)
