"""A clairvoyant reference for the prefix cache: Belady's farthest-next-use rule under the tree constraint.

How good is the radix cache's LRU eviction when the pool is *smaller* than the working set? Against
the never-evicting optimum the answer is unfair (no pool that small can reach it); against another
online policy it is arbitrary. The reference here sees the whole request trace in advance and
evicts, every time, the cached block whose next use lies farthest in the future (Belady, 1966),
under exactly the constraints and the space accounting the real cache lives with.

**The model** (the same as ``studylib.kvcache.replay.replay_hits``, i.e. ``PrefixCachedDecoder``
with a single stream). A request ``i`` is a prompt ``p`` and an output ``o``; its KV covers
``s = (p + o)[:kv_len]`` with ``kv_len = |p| + |o| - 1``, and its *query* is ``q = p[:-1]`` (the last
prompt token is always recomputed). A *block* is a run of ``B = block_size`` tokens named by its
whole token path from position 0, so block ``d`` of a sequence has block ``d - 1`` of the same
sequence as its parent, and two requests share a block exactly when they share that whole prefix.
The pool holds ``N`` blocks. The cache is a set ``C`` of blocks that is *prefix-closed* (a tree:
a cached block's parent is cached). Request ``i`` runs in four steps:

1. *hit*: ``h`` = the number of whole blocks of ``q`` in ``C`` (a prefix of ``q``'s path, because
   ``C`` is prefix-closed); the request scores ``h * B`` hit tokens;
2. *lock*: those ``h`` blocks are in use and may not be evicted;
3. *allocate*: the request needs ``n = ceil(kv_len / B) - h`` fresh blocks (its misses, its output
   and its trailing partial block; a cached block past ``q``'s whole blocks is allocated again, as
   the real cache does). If ``|C| + n > N``, ``|C| + n - N`` blocks leave ``C``, one at a time, each
   an *unlocked leaf* of ``C`` (no cached child, not locked) -- the tree constraint;
4. *insert*: ``C`` gains every whole block of ``s``; the partial block and duplicates are freed.

The policies differ only in which leaf goes at step 3:

- ``lru`` -- the radix cache's rule: the leaf whose last access (a match or an insert walking
  through it) is oldest. It reproduces ``replay_hits`` request by request (tests/test_belady.py).
- ``belady`` -- the leaf whose *next use* is farthest away. At request ``t`` the next use of a
  block ``b`` is the first request ``j >= t`` whose query holds ``b`` among its whole blocks (it hits
  ``b`` if ``b`` is still cached). If some request ``t <= k < j`` first recomputes and re-inserts
  ``b`` anyway (``b`` lies in ``s_k`` but not in ``q_k``: a repeated prompt whose output rebuilds it),
  or no later query holds ``b``, keeping ``b`` is worth nothing and its next use counts as infinite.
  Ties go to the deepest leaf, then to the block created last.

**What kind of reference it is.** Every query that holds a block holds its parent, so a child's
next use is never earlier than its parent's: the farthest-used block of ``C`` is always a leaf (or
ties with one), and evicting the farthest leaf one at a time evicts the ``m`` farthest blocks of
``C``. The tree constraint therefore never binds the rule (only the "rebuilt for free" refinement
above can make a parent look farther than its child), and locked blocks, used by the request being
served, are the nearest of all. Evicting on demand only and caching every computed block lose
nothing: a block one could have skipped can still be evicted later, at no cost, when space is
needed. For requests of one page each, farthest-next-use is provably optimal (Belady's MIN;
Mattson et al., 1970). Here a request touches a whole path at once, needs scratch blocks whose
number depends on its own hit, counts hits on its prompt only and rebuilds its output's blocks for
free; we do not re-prove MIN for that setting, so this is **Belady's farthest-next-use heuristic
under the tree constraint**, a clairvoyant reference, not a proven upper bound. The tests check
it where it can be checked: it equals an exhaustive search over every admissible eviction (lazy or
not, caching or bypassing) on small random traces, it is never below LRU on random shared-prefix
traces, and it equals the never-evicting optimum once the pool holds the working set (nothing is
evicted, so every policy coincides there).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence

from studylib.errors import StudylibError

POLICIES = ("lru", "belady")
INF = float("inf")
ROOT = 0  # the empty path: every depth-1 block's parent


class BlockIds:
    """Interns block paths: block ``d`` of a sequence gets one integer id per distinct token prefix."""

    def __init__(self, block_size: int):
        self.bs = int(block_size)
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}
        self.parent: list[int] = [-1]
        self.depth: list[int] = [0]

    def path(self, tokens: Sequence[int]) -> list[int]:
        """Ids of the whole blocks of ``tokens``, root first."""
        out, cur, bs = [], ROOT, self.bs
        for k in range(len(tokens) // bs):
            key = (cur, tuple(int(t) for t in tokens[k * bs : (k + 1) * bs]))
            nid = self._ids.get(key)
            if nid is None:
                nid = len(self.parent)
                self._ids[key] = nid
                self.parent.append(cur)
                self.depth.append(k + 1)
            out.append(nid)
            cur = nid
        return out


class Trace:
    """A request trace as block ids: per request its query blocks, its KV blocks and its KV length."""

    def __init__(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], block_size: int):
        self.block_size = int(block_size)
        self.sequences = [(list(p), list(o)) for p, o in sequences]
        self.ids = BlockIds(block_size)
        self.queries: list[list[int]] = []
        self.kv_blocks: list[list[int]] = []
        self.kv_lens: list[int] = []
        self.prompt_lens: list[int] = []
        for prompt, out in self.sequences:
            kv_len = len(prompt) + len(out) - 1
            seq = (prompt + out)[:kv_len]
            self.queries.append(self.ids.path(prompt[:-1]))
            self.kv_blocks.append(self.ids.path(seq))
            self.kv_lens.append(kv_len)
            self.prompt_lens.append(len(prompt))
        # Per block: the requests whose KV holds it, and whether their query holds it too (a use) or not
        # (the request rebuilds it for free).
        self._events: dict[int, tuple[list[int], list[bool]]] = {}
        for j, (q, s) in enumerate(zip(self.queries, self.kv_blocks, strict=True)):
            for d, b in enumerate(s):
                when, used = self._events.setdefault(b, ([], []))
                when.append(j)
                used.append(d < len(q))

    def __len__(self) -> int:
        return len(self.queries)

    def next_use(self, block: int, t: int) -> float:
        """The first request >= ``t`` that would hit ``block``; infinite if it is rebuilt first or never used."""
        when, used = self._events.get(block, ((), ()))
        k = bisect.bisect_left(when, t)
        if k == len(when) or not used[k]:
            return INF
        return when[k]


class BlockCache:
    """The prefix-closed set of cached blocks, with the replay's space accounting and one eviction rule.

    ``on_evict(cache, t, block)`` (optional) is called just before a block leaves the cache while
    serving request ``t``, with ``cache.cached`` / ``cache.locked`` / ``cache.kids`` as they stand.
    """

    def __init__(self, trace: Trace, num_blocks: int, policy: str = "belady",
                 on_evict: Callable[[BlockCache, int, int], None] | None = None):
        if policy not in POLICIES:
            raise StudylibError(f"unknown eviction policy {policy!r}; one of {POLICIES}")
        self.trace, self.num_blocks, self.policy, self.on_evict = trace, int(num_blocks), policy, on_evict
        self.parent, self.depth = trace.ids.parent, trace.ids.depth
        self.cached: set[int] = set()
        self.kids: dict[int, int] = {}  # cached block -> number of cached children
        self.locked: set[int] = set()
        self.last: dict[int, int] = {}  # LRU clock per block: one tick per match and per insert
        self.tick = 0
        self.evicted = 0

    def is_leaf(self, b: int) -> bool:
        return b in self.cached and self.kids.get(b, 0) == 0

    def _key(self, b: int, t: int) -> tuple:
        """Heap key: the smallest key is evicted first."""
        if self.policy == "lru":
            return (self.last[b], -self.depth[b], -b)
        return (-self.trace.next_use(b, t), -self.depth[b], -b)

    def match(self, query: Sequence[int]) -> int:
        self.tick += 1
        h = 0
        for b in query:
            if b not in self.cached:
                break
            self.last[b] = self.tick
            h += 1
        return h

    def evict(self, m: int, t: int) -> None:
        heap = [(self._key(b, t), b) for b in self.cached if self.kids.get(b, 0) == 0 and b not in self.locked]
        heapq.heapify(heap)
        while m > 0:
            if not heap:
                raise StudylibError("no unlocked leaf left to evict: the request cannot fit in the pool")
            _, b = heapq.heappop(heap)
            if self.on_evict is not None:
                self.on_evict(self, t, b)
            self.cached.discard(b)
            self.kids.pop(b, None)
            self.last.pop(b, None)
            self.evicted += 1
            m -= 1
            p = self.parent[b]
            if p != ROOT:
                self.kids[p] -= 1
                if self.kids[p] == 0 and p not in self.locked:
                    heapq.heappush(heap, (self._key(p, t), p))

    def insert(self, blocks: Sequence[int]) -> None:
        self.tick += 1
        for b in blocks:
            if b not in self.cached:
                self.cached.add(b)
                p = self.parent[b]
                if p != ROOT:
                    self.kids[p] = self.kids.get(p, 0) + 1
            self.last[b] = self.tick


def simulate(sequences: Sequence[tuple[Sequence[int], Sequence[int]]] | Trace, *, block_size: int,
             num_blocks: int, policy: str = "belady",
             on_evict: Callable[[BlockCache, int, int], None] | None = None) -> dict:
    """Replay ``sequences`` = [(prompt, output), ...] through a pool of ``num_blocks`` blocks under
    ``policy`` ("belady" or "lru"); the same keys as ``replay_hits``, with per-request hit tokens."""
    trace = sequences if isinstance(sequences, Trace) else Trace(sequences, block_size)
    if trace.block_size != block_size:
        raise ValueError(f"the trace was built for block size {trace.block_size}, not {block_size}")
    cache = BlockCache(trace, num_blocks, policy, on_evict)
    hits, peak = [], 0
    for t in range(len(trace)):
        need_total = -(-trace.kv_lens[t] // block_size)
        if -(-(trace.kv_lens[t] + 1) // block_size) > num_blocks:  # the decoder's check: room for one more token
            raise StudylibError(f"request {t} needs {trace.kv_lens[t] + 1} tokens of KV but the pool holds "
                                f"{num_blocks} blocks of {block_size}; raise the pool size.")
        q = trace.queries[t]
        h = cache.match(q)
        cache.locked = set(q[:h])
        need = need_total - h
        over = len(cache.cached) + need - num_blocks
        if over > 0:
            cache.evict(over, t)
        peak = max(peak, len(cache.cached) + need)
        cache.insert(trace.kv_blocks[t])
        cache.locked = set()
        hits.append(h * block_size)
    prompts = sum(trace.prompt_lens)
    return {"hits": hits, "hit_tokens": sum(hits), "prompt_tokens": prompts,
            "hit_rate": sum(hits) / max(prompts, 1), "evicted_blocks": cache.evicted,
            "num_blocks": int(num_blocks), "peak_blocks": peak, "policy": policy}


def belady_hits(sequences: Sequence[tuple[Sequence[int], Sequence[int]]] | Trace, *, block_size: int,
                num_blocks: int) -> dict:
    """The clairvoyant reference (see the module docstring) at a pool of ``num_blocks`` blocks."""
    return simulate(sequences, block_size=block_size, num_blocks=num_blocks, policy="belady")
