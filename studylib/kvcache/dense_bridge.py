"""A radix prefix cache for the single-request decoders that run on a contiguous ``DenseKVCache``.

Speculative, prompt-lookup and lookahead decoding roll their cache back and compact it, which the
contiguous cache does best. ``PrefixStore`` lets them stack with prefix caching anyway: before
prefill, the longest cached prefix is copied out of the paged pool into the dense cache (a memory
copy, far cheaper than recomputing it) and only the suffix is prefilled; after the request, the
sequence's KV is written back into pool blocks and inserted into the radix tree.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from studylib.kvcache import make_prefix_cache
from studylib.kvcache.pool import PagedKVPool
from studylib.models import DenseKVCache, LlamaModel


class PrefixStore:
    def __init__(self, model: LlamaModel, cache: str = "radix", *, capacity_tokens: int = 16384,
                 block_size: int = 16):
        self.model = model
        self.pool = PagedKVPool(model.config, block_size=block_size, num_blocks=-(-capacity_tokens // block_size),
                                device=model.device, dtype=model.dtype)
        self.cache = make_prefix_cache(cache, self.pool)
        self.last_hit = 0

    @property
    def metrics(self):
        return self.cache.metrics

    def load(self, prompt_ids: Sequence[int], dense: DenseKVCache) -> int:
        """Fill ``dense`` (empty) with the longest cached prefix of the prompt; return its length.

        The last prompt token is never taken from the cache: its forward produces the first logits.
        """
        match = self.cache.match_prefix([int(t) for t in prompt_ids[:-1]])
        hit = match.length
        if hit:
            for layer in range(self.model.config.num_layers):
                k, v = self.pool.read(layer, match.blocks, hit)  # (Hkv, hit, D)
                dense.k[layer][0, :, :hit] = k
                dense.v[layer][0, :, :hit] = v
            dense.length = hit
            dense.next_pos.fill_(hit)
        self.last_hit = hit
        return hit

    def store(self, token_ids: Sequence[int], dense: DenseKVCache) -> None:
        """Insert the sequence whose KV sits in ``dense``'s first len(token_ids) slots."""
        toks = [int(t) for t in token_ids][: dense.length]
        n = len(toks) // self.pool.block_size * self.pool.block_size
        if n == 0:
            return
        match = self.cache.match_prefix(toks[:n], record=False)
        if match.length >= n:
            return
        self.cache.lock(match.node)  # keep the shared part alive while new blocks are allocated
        try:
            new = self.pool.alloc(self.pool.blocks_for(n) - len(match.blocks))
        except Exception:
            self.cache.unlock(match.node)
            return  # a full pool of locked blocks: skip caching this one, results are unaffected
        table = list(match.blocks) + new
        idx = self.pool.slots(table, match.length, n)
        for layer in range(self.model.config.num_layers):
            k = dense.k[layer][0, :, match.length : n].transpose(0, 1)  # (n', Hkv, D)
            self.pool.k_slots(layer).index_copy_(0, idx, k)
            self.pool.v_slots(layer).index_copy_(0, idx, dense.v[layer][0, :, match.length : n].transpose(0, 1))
        self.cache.insert(toks[:n], table)
        self.cache.unlock(match.node)
        self.pool.decref(new)  # the tree holds its own reference now

    def clear(self) -> None:
        self.cache.clear()
        self.cache.reset_metrics()


def prefill(model: LlamaModel, prompt_ids: Sequence[int], capacity: int, prefix_store: PrefixStore | None = None,
            ) -> tuple[DenseKVCache, torch.Tensor]:
    """A dense cache holding the prompt, and the last prompt position's logits (1, V).

    With a ``prefix_store``, the cached prefix is copied in and only the suffix runs through the model.
    """
    cache = DenseKVCache(model.config, 1, capacity, model.device, model.dtype)
    hit = prefix_store.load(prompt_ids, cache) if prefix_store is not None else 0
    ids = torch.as_tensor([int(t) for t in prompt_ids[hit:]], dtype=torch.long, device=model.device)[None]
    logits = model(ids, cache.begin(ids.shape[1]), logits="last").logits[:, -1]
    return cache, logits
