"""The no-sharing baseline behind the prefix-cache interface, and ``make_prefix_cache``.

``NoPrefixCache`` never matches, never holds a block and never evicts, so a caller written against
``RadixCache`` runs unchanged and every prompt token is a miss (what an engine without prefix
caching does).
"""

from __future__ import annotations

from collections.abc import Sequence

from studylib.errors import StudylibError
from studylib.kvcache.pool import PagedKVPool
from studylib.kvcache.radix import CacheMetrics, InsertResult, MatchResult, Node, RadixCache

PREFIX_CACHES = ("radix", "none")


class NoPrefixCache:
    name = "none"

    def __init__(self, pool: PagedKVPool):
        self.pool = pool
        self.bs = pool.block_size
        self.root = Node((), [], None, 0)
        self.metrics = CacheMetrics()
        self.cached_blocks = 0
        self.cached_tokens = 0

    def match_prefix(self, tokens: Sequence[int], *, record: bool = True, touch: bool = True) -> MatchResult:
        if record:
            self.metrics.miss_tokens += len(tokens)
        return MatchResult(0, [], self.root)

    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> InsertResult:
        return InsertResult(0, 0, self.root)

    def lock(self, node: Node) -> None:
        pass

    def unlock(self, node: Node) -> None:
        pass

    def evictable(self) -> list[Node]:
        return []

    def evict(self, num_blocks: int) -> int:
        return 0

    def clear(self) -> int:
        return 0

    def cached_sequences(self) -> list[tuple[int, ...]]:
        return []

    def reset_metrics(self) -> None:
        self.metrics = CacheMetrics()


def make_prefix_cache(name: str, pool: PagedKVPool) -> RadixCache | NoPrefixCache:
    """``"radix"`` (share cached prefixes) or ``"none"`` (no sharing) over ``pool``."""
    if name == "radix":
        return RadixCache(pool)
    if name == "none":
        return NoPrefixCache(pool)
    raise StudylibError(f"unknown prefix cache {name!r}; choose one of {list(PREFIX_CACHES)}.")
