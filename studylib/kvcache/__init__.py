"""Paged KV storage and prefix caching (chapter 4; the serving engine of chapter 5 builds on it).

- ``PagedKVPool``: fixed-size KV blocks with a free list, reference counts and a byte budget.
- ``PagedBatch``: the runtime KV view over a ragged batch whose KV lives in the pool.
- ``RadixCache`` / ``NoPrefixCache``: prefix caches behind one interface; ``make_prefix_cache``.
- ``PrefixCachedDecoder``: a single-request generator that reuses cached prefixes.
"""

from studylib.kvcache.naive import PREFIX_CACHES, NoPrefixCache, make_prefix_cache
from studylib.kvcache.paged_view import PagedBatch
from studylib.kvcache.pool import PagedKVPool, PoolExhausted
from studylib.kvcache.radix import CacheMetrics, InsertResult, MatchResult, RadixCache

__all__ = [
    "PREFIX_CACHES", "CacheMetrics", "InsertResult", "MatchResult", "NoPrefixCache", "PagedBatch",
    "PagedKVPool", "PoolExhausted", "RadixCache", "make_prefix_cache",
]
