"""Which pool blocks each running request holds, and how they are shared with the prefix cache.

A request's ``block_table`` lists its blocks in position order; it owns one pool reference on each.
At admission the longest cached prefix (whole blocks, and never the last prompt token, whose logits
we need) is taken from the prefix cache: those blocks are shared (``incref``) and the matched node is
locked so the tree does not drop what the request is reading. Blocks for new tokens are allocated as
the request grows. When the prefill completes and again when the request ends, its computed tokens
are inserted into the tree (the tree takes its own references), so concurrent and later requests can
hit them; then the request drops its own references.
"""

from __future__ import annotations

from studylib.kvcache import PagedKVPool, PoolExhausted
from studylib.serving.request import Request


class BlockManager:
    def __init__(self, pool: PagedKVPool, prefix_cache):
        self.pool = pool
        self.cache = prefix_cache  # a studylib.kvcache RadixCache or NoPrefixCache
        self.bs = pool.block_size

    def usable_hit(self, req: Request, matched: int) -> int:
        # Keep >= 1 token to compute (its logits give the next token) and stay on a block boundary:
        # the block holding the first computed token must be private, or we would write into shared KV.
        return min(matched, (req.num_tokens - 1) // self.bs * self.bs)

    def peek(self, req: Request) -> int:
        """Tokens ``req`` would reuse if admitted now (no metrics, no LRU touch): the cache-aware order."""
        m = self.cache.match_prefix(req.all_ids, record=False, touch=False)
        return self.usable_hit(req, m.length)

    def admit(self, req: Request, max_tokens: int) -> int | None:
        """Attach the cached prefix to a waiting request and allocate blocks for its first chunk of at
        most ``max_tokens`` tokens. Returns the chunk size, or None (nothing changed) if the pool cannot
        hold it even after evicting cold prefixes."""
        m = self.cache.match_prefix(req.all_ids, record=False)
        hit = self.usable_hit(req, m.length)
        blocks = m.blocks[: hit // self.bs]
        self.pool.incref(blocks)
        self.cache.lock(m.node)
        req.prefix_handle, req.block_table, req.num_computed = m.node, list(blocks), hit
        n = min(req.remaining, max_tokens)
        if not self.grow(req, hit + n):
            self.release(req, cache=False)
            return None
        if not req.admitted_once:  # count hits once per request, not again after a preemption
            req.prefix_hit_tokens, req.admitted_once = hit, True
            self.cache.metrics.hit_tokens += hit
            self.cache.metrics.miss_tokens += req.num_tokens - hit
        return n

    def grow(self, req: Request, num_tokens: int) -> bool:
        """Make ``req``'s table cover ``num_tokens`` tokens; False when the pool is exhausted even after
        evicting cold prefixes (the pool's reclaimer does that), leaving everything unchanged."""
        need = self.pool.blocks_for(num_tokens) - len(req.block_table)
        if need <= 0:
            return True
        try:
            req.block_table.extend(self.pool.alloc(need))
        except PoolExhausted:
            return False
        return True

    def cache_computed(self, req: Request) -> None:
        """Insert the tokens whose KV ``req`` has computed into the prefix cache; re-lock at the new end."""
        if req.num_computed < self.bs or self.cache.name == "none":
            return
        res = self.cache.insert(req.all_ids[: req.num_computed], req.block_table)
        self.cache.lock(res.node)
        if req.prefix_handle is not None:
            self.cache.unlock(req.prefix_handle)
        req.prefix_handle = res.node

    def release(self, req: Request, *, cache: bool) -> None:
        """Drop ``req``'s blocks (after caching its computed prefix when ``cache``)."""
        if cache:
            self.cache_computed(req)
        if req.prefix_handle is not None:
            self.cache.unlock(req.prefix_handle)
            req.prefix_handle = None
        self.pool.decref(req.block_table)
        req.block_table = []
        req.num_computed = 0
