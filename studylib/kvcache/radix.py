"""A radix tree over token ids whose edges own KV blocks: prefix caching in the style of SGLang's
RadixAttention (Zheng et al., 2024), written for the block-granular ``PagedKVPool``.

Each edge holds a run of tokens and the pool blocks caching their KV. With ``block_size > 1`` the
tree caches *whole blocks only*: keys are cut to a multiple of the block size, matches and splits
happen at block boundaries, and a sequence's trailing partial block stays private to it. That is
the choice vLLM's block-hash cache makes too; it costs up to block_size - 1 tokens of hit per
request, and in exchange a cached block is never written again (no copy-on-write is needed) and a
block id is all it takes to share KV. ``block_size = 1`` gives the classic token-level radix tree.

Ownership: the tree holds one pool reference on each block it caches. ``insert`` *adds* the tree's
reference (``incref``), so the caller still owns its own references and releases them as usual;
blocks the tree already had for the same tokens are simply left to the caller to free. ``lock``
pins a node and its ancestors against eviction while a request reads their blocks.

Eviction is LRU over unlocked leaves (trimming a leaf's tail when only part of it must go), on a logical clock (one tick per match or insert) so that it
is deterministic; wall-clock ages are recorded for the metrics.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from studylib.kvcache.pool import PagedKVPool


class Node:
    __slots__ = ("key", "blocks", "children", "parent", "start", "lock_ref", "last_tick", "last_s", "uid")
    _ids = itertools.count()

    def __init__(self, key: tuple[int, ...], blocks: list[int], parent: Node | None, start: int):
        self.key = key  # the edge's tokens (a multiple of block_size)
        self.blocks = blocks  # len(key) // block_size pool blocks
        self.children: dict[tuple[int, ...], Node] = {}  # keyed by the child's first block of tokens
        self.parent = parent
        self.start = start  # tokens on the path before this edge
        self.lock_ref = 0
        self.last_tick = 0
        self.last_s = time.monotonic()
        self.uid = next(Node._ids)

    @property
    def end(self) -> int:
        return self.start + len(self.key)

    def path(self) -> tuple[int, ...]:
        """All tokens from the root to the end of this node."""
        parts, n = [], self
        while n is not None:
            parts.append(n.key)
            n = n.parent
        return tuple(t for part in reversed(parts) for t in part)

    def __repr__(self) -> str:
        return f"Node(start={self.start}, len={len(self.key)}, lock={self.lock_ref}, tick={self.last_tick})"


@dataclass
class MatchResult:
    length: int  # tokens matched (a multiple of block_size)
    blocks: list[int]  # the blocks caching them, in order
    node: Node  # the deepest matched node: lock it while the blocks are in use


@dataclass
class InsertResult:
    cached_before: int  # tokens of the sequence the tree already held
    inserted: int  # tokens newly cached by this call
    node: Node  # the node ending the cached path


@dataclass
class CacheMetrics:
    hit_tokens: int = 0
    miss_tokens: int = 0
    inserted_tokens: int = 0
    evictions: int = 0  # nodes evicted
    evicted_blocks: int = 0
    eviction_age_ticks: list[int] = field(default_factory=list)
    eviction_age_s: list[float] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        total = self.hit_tokens + self.miss_tokens
        return self.hit_tokens / total if total else 0.0

    def as_dict(self) -> dict:
        ages = sorted(self.eviction_age_s)
        return {
            "hit_tokens": self.hit_tokens, "miss_tokens": self.miss_tokens, "hit_rate": self.hit_rate,
            "inserted_tokens": self.inserted_tokens, "evictions": self.evictions,
            "evicted_blocks": self.evicted_blocks,
            "median_eviction_age_s": ages[len(ages) // 2] if ages else None,
        }


class RadixCache:
    name = "radix"

    def __init__(self, pool: PagedKVPool, *, attach: bool = True):
        self.pool = pool
        self.bs = pool.block_size
        self.root = Node((), [], None, 0)
        self.root.lock_ref = 1  # the root is never evicted
        self.tick = 0
        self.metrics = CacheMetrics()
        self.cached_blocks = 0
        if attach:
            # Let the pool evict cold prefixes on its own when an allocation would otherwise fail.
            pool.reclaimer = self.evict

    # ---- lookup ---------------------------------------------------------------------------------
    def _full(self, tokens: Sequence[int]) -> tuple[int, ...]:
        n = len(tokens) // self.bs * self.bs
        return tuple(int(t) for t in tokens[:n])

    def _common_blocks(self, key: tuple[int, ...], tokens: tuple[int, ...], at: int) -> int:
        """How many whole blocks of ``key`` equal ``tokens[at:]``, in tokens."""
        n = 0
        limit = min(len(key), len(tokens) - at)
        while n + self.bs <= limit and key[n : n + self.bs] == tokens[at + n : at + n + self.bs]:
            n += self.bs
        return n

    def match_prefix(self, tokens: Sequence[int], *, record: bool = True, touch: bool = True) -> MatchResult:
        """The longest cached prefix of ``tokens`` (whole blocks). Splits an edge matched part-way.

        ``record=False`` leaves the hit/miss metrics alone (a scheduler peeking to order requests);
        ``touch=False`` leaves the LRU clock alone.
        """
        toks = self._full(tokens)
        if touch:
            self.tick += 1
        node, pos, blocks = self.root, 0, []
        while pos < len(toks):
            child = node.children.get(toks[pos : pos + self.bs])
            if child is None:
                break
            n = self._common_blocks(child.key, toks, pos)
            if n < len(child.key):
                child = self._split(child, n)
            blocks.extend(child.blocks)
            pos += n
            node = child
            if touch:
                self._touch(node)
        if record:
            self.metrics.hit_tokens += pos
            self.metrics.miss_tokens += len(tokens) - pos
        return MatchResult(pos, blocks, node)

    def _touch(self, node: Node) -> None:
        node.last_tick = self.tick
        node.last_s = time.monotonic()

    def _split(self, node: Node, n: int) -> Node:
        """Cut ``node``'s edge after ``n`` tokens; return the new upper part (``node`` keeps its identity,
        so whoever locked it still unlocks the right path)."""
        k = n // self.bs
        upper = Node(node.key[:n], node.blocks[:k], node.parent, node.start)
        upper.lock_ref = node.lock_ref  # every lock on node also pins its ancestors
        upper.last_tick, upper.last_s = node.last_tick, node.last_s
        node.parent.children[node.key[: self.bs]] = upper
        node.key, node.blocks, node.start = node.key[n:], node.blocks[k:], node.start + n
        node.parent = upper
        upper.children[node.key[: self.bs]] = node
        return upper

    # ---- insertion ------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> InsertResult:
        """Cache the whole blocks of ``tokens``, whose KV lives in ``blocks`` (the sequence's block table).

        The tree takes its own reference on the blocks it keeps; the caller's references are untouched.
        """
        toks = self._full(tokens)
        if len(blocks) < len(toks) // self.bs:
            raise ValueError(f"{len(toks)} tokens need {len(toks) // self.bs} blocks, got {len(blocks)}")
        self.tick += 1
        node, pos = self.root, 0
        while pos < len(toks):
            child = node.children.get(toks[pos : pos + self.bs])
            if child is None:
                break
            n = self._common_blocks(child.key, toks, pos)
            if n < len(child.key):
                child = self._split(child, n)
            pos += n
            node = child
            self._touch(node)
        before = pos
        if pos < len(toks):
            new_blocks = list(blocks[pos // self.bs : len(toks) // self.bs])
            self.pool.incref(new_blocks)
            leaf = Node(toks[pos:], new_blocks, node, pos)
            node.children[leaf.key[: self.bs]] = leaf
            self._touch(leaf)
            self.cached_blocks += len(new_blocks)
            node = leaf
        self.metrics.inserted_tokens += len(toks) - before
        return InsertResult(before, len(toks) - before, node)

    # ---- locking --------------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        n = node
        while n is not None:
            if n.lock_ref <= (1 if n is self.root else 0):
                raise RuntimeError(f"unlock of an unlocked node {n}: lock/unlock calls are unbalanced")
            n = n.parent
        while node is not None:
            node.lock_ref -= 1
            node = node.parent

    # ---- eviction -------------------------------------------------------------------------------
    def evictable(self) -> list[Node]:
        """Unlocked leaves, least recently used first."""
        out = [n for n in self._nodes() if not n.children and n.lock_ref == 0 and n is not self.root]
        return sorted(out, key=lambda n: (n.last_tick, n.uid))

    def evict(self, num_blocks: int) -> int:
        """Evict from LRU unlocked leaves until ``num_blocks`` blocks went back to the pool (or none is left).

        A leaf longer than what is still needed loses only its tail blocks (the start of its text stays
        useful to later requests); otherwise it goes whole and its parent may become the next leaf.
        Returns the blocks actually freed: a block a running sequence still references survives the
        tree's release, so freeing can lag eviction.
        """
        heap = [(n.last_tick, n.uid, n) for n in self.evictable()]
        heapq.heapify(heap)
        freed = 0
        now = time.monotonic()
        while freed < num_blocks and heap:
            _, _, node = heapq.heappop(heap)
            take = min(len(node.blocks), num_blocks - freed)
            drop = node.blocks[len(node.blocks) - take :]
            m = self.metrics
            m.evictions += 1
            m.evicted_blocks += take
            m.eviction_age_ticks.append(self.tick - node.last_tick)
            m.eviction_age_s.append(now - node.last_s)
            self.cached_blocks -= take
            freed += self.pool.decref(drop)
            if take < len(node.blocks):
                node.blocks = node.blocks[: len(node.blocks) - take]
                node.key = node.key[: len(node.blocks) * self.bs]
                heapq.heappush(heap, (node.last_tick, node.uid, node))
                continue
            parent = node.parent
            del parent.children[node.key[: self.bs]]
            node.parent = None
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_tick, parent.uid, parent))
        return freed

    def clear(self) -> int:
        """Evict everything unlocked; returns blocks freed."""
        return self.evict(self.pool.num_blocks + 1)

    # ---- introspection --------------------------------------------------------------------------
    def _nodes(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    @property
    def cached_tokens(self) -> int:
        return self.cached_blocks * self.bs

    def cached_sequences(self) -> list[tuple[int, ...]]:
        """The token paths to every leaf (what the tree can currently serve)."""
        return [n.path() for n in self._nodes() if not n.children and n is not self.root]

    def reset_metrics(self) -> None:
        self.metrics = CacheMetrics()
