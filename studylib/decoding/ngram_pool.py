"""The n-gram pool of lookahead decoding: harvested n-grams keyed by their first token.

Bounded and deterministic, so two runs of the same prompt verify the same candidates:
- each key keeps at most ``per_key`` continuations; re-adding one refreshes it, and the least
  recently added one is evicted first (per-key LRU);
- at most ``max_keys`` keys; when a new key would exceed that, the key least recently added to is
  dropped with all its continuations.
So the pool never holds more than ``per_key * max_keys`` n-grams.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from studylib.errors import StudylibError


@dataclass(frozen=True)
class PoolConfig:
    per_key: int = 8
    max_keys: int = 4096

    def __post_init__(self) -> None:
        if self.per_key < 1:
            raise StudylibError(f"the n-gram pool needs per_key >= 1, got {self.per_key}.")
        if self.max_keys < 1:
            raise StudylibError(f"the n-gram pool needs max_keys >= 1, got {self.max_keys}.")


class NGramPool:
    def __init__(self, config: PoolConfig = PoolConfig()):
        self.config = config
        # key token -> continuations (tuples of n-1 tokens), oldest first; keys ordered oldest first.
        self._pool: OrderedDict[int, OrderedDict[tuple[int, ...], None]] = OrderedDict()
        self.added = 0
        self.evicted = 0

    def __len__(self) -> int:
        """Number of n-grams held."""
        return sum(len(v) for v in self._pool.values())

    @property
    def keys(self) -> list[int]:
        return list(self._pool)

    def add(self, key: int, continuation: Sequence[int]) -> None:
        """Insert the n-gram ``(key, *continuation)``."""
        cont = tuple(int(t) for t in continuation)
        if not cont:
            return
        key = int(key)
        bucket = self._pool.get(key)
        if bucket is None:
            if len(self._pool) >= self.config.max_keys:
                _, dropped = self._pool.popitem(last=False)
                self.evicted += len(dropped)
            bucket = self._pool[key] = OrderedDict()
        else:
            self._pool.move_to_end(key)
        if cont in bucket:
            bucket.move_to_end(cont)
        else:
            bucket[cont] = None
            self.added += 1
            if len(bucket) > self.config.per_key:
                bucket.popitem(last=False)
                self.evicted += 1

    def add_from_sequence(self, tokens: Sequence[int], n: int) -> None:
        """Insert every n-gram of ``tokens`` (e.g. the prompt), in order."""
        toks = [int(t) for t in tokens]
        for i in range(len(toks) - n + 1):
            self.add(toks[i], toks[i + 1 : i + n])

    def lookup(self, key: int, limit: int) -> list[tuple[int, ...]]:
        """Up to ``limit`` continuations of ``key``, most recently added first."""
        bucket = self._pool.get(int(key))
        if not bucket or limit <= 0:
            return []
        out: list[tuple[int, ...]] = []
        for cont in reversed(bucket):
            out.append(cont)
            if len(out) == limit:
                break
        return out

    def items(self) -> Iterable[tuple[int, tuple[int, ...]]]:
        for key, bucket in self._pool.items():
            for cont in bucket:
                yield key, cont


__all__ = ["NGramPool", "PoolConfig"]
