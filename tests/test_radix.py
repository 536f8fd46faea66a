"""The radix prefix cache against a reference model: a dict of every cached sequence."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from studylib.errors import StudylibError
from studylib.kvcache import NoPrefixCache, PagedKVPool, PoolExhausted, RadixCache, make_prefix_cache
from studylib.models.presets import tiny_config

CFG = tiny_config()


def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class Reference:
    """What the tree should hold: sequences (whole blocks) and the history of operations."""

    def __init__(self, bs):
        self.bs = bs
        self.seqs: set[tuple[int, ...]] = set()
        self.history: list[tuple[int, ...]] = []  # the path each match / insert walked, in order

    def full(self, seq):
        return tuple(seq[: len(seq) // self.bs * self.bs])

    def match(self, seq):
        toks = self.full(seq)
        best = max((common(s, toks) for s in self.seqs), default=0)
        return best // self.bs * self.bs

    def last_access(self, path, start):
        """Index of the last operation that walked into the edge [start, len(path)) of ``path``."""
        walked_into = (i for i, w in enumerate(self.history) if common(w, path) // self.bs * self.bs > start)
        return max(walked_into, default=-1)


def write_markers(pool, blocks, tokens):
    """Stamp each slot with its token id, so a match can be checked against the KV it returns."""
    idx = pool.slots(blocks, 0, len(tokens))
    pool.k_slots(0)[idx, 0, 0] = torch.tensor(tokens, dtype=torch.float32)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(0, 2), max_size=10)),
        st.tuples(st.just("match"), st.lists(st.integers(0, 2), max_size=10)),
        st.tuples(st.just("lock"), st.lists(st.integers(0, 2), max_size=10)),
        st.tuples(st.just("unlock"), st.integers(0, 99)),
        st.tuples(st.just("evict"), st.integers(1, 4)),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bs=st.sampled_from([1, 2, 3]), program=ops)
def test_radix_matches_reference(bs, program):
    pool = PagedKVPool(CFG, block_size=bs, num_blocks=24)
    tree = RadixCache(pool, attach=False)  # no automatic eviction: the program drives it
    ref = Reference(bs)
    locked = []  # (node, path) pairs currently locked
    for op, arg in program:
        if op == "insert":
            seq = tuple(arg)
            try:
                table = pool.alloc(pool.blocks_for(len(seq)))
            except PoolExhausted:
                continue
            write_markers(pool, table, seq)
            expect_before = ref.match(seq)
            res = tree.insert(seq, table)
            pool.decref(table)  # the caller lets go; the tree keeps what it cached
            assert res.cached_before == expect_before
            assert res.inserted == len(ref.full(seq)) - expect_before
            ref.seqs.add(ref.full(seq))
            ref.history.append(ref.full(seq))
        elif op in ("match", "lock"):
            seq = tuple(arg)
            res = tree.match_prefix(seq)
            assert res.length == ref.match(seq)
            assert len(res.blocks) == res.length // bs
            assert res.node.path() == seq[: res.length]
            if res.length:
                marks = pool.k_slots(0)[pool.slots(res.blocks, 0, res.length), 0, 0]
                assert marks.tolist() == list(seq[: res.length])
            ref.history.append(seq[: res.length])
            if op == "lock":
                tree.lock(res.node)
                locked.append((res.node, seq[: res.length]))
        elif op == "unlock":
            if locked:
                node, _ = locked.pop(arg % len(locked))
                tree.unlock(node)
        else:
            for _ in range(arg):
                candidates = tree.evictable()
                if not candidates:
                    assert tree.evict(1) == 0
                    break
                before = {n.uid: (n, n.path(), n.start, len(n.blocks)) for n in candidates}
                oldest = min(ref.last_access(path, start) for _, path, start, _ in before.values())
                assert tree.evict(1) == 1  # the LRU leaf loses its last block (or goes, if it had one)
                hit = [v for v in before.values() if v[0].parent is None or len(v[0].blocks) < v[3]]
                assert len(hit) == 1
                victim, path, start, nblocks = hit[0]
                assert (victim.parent is None) == (nblocks == 1)
                assert victim.parent is None or len(victim.blocks) == nblocks - 1
                assert ref.last_access(path, start) == oldest, "eviction is not LRU"
                keep = len(path) - bs
                ref.seqs = {s[:keep] if s[: len(path)] == path else s for s in ref.seqs}
                ref.seqs.discard(())
        # Invariants after every operation.
        pool.check_accounting()
        held = sum(len(n.blocks) for n in tree._nodes())
        assert held == pool.num_used == tree.cached_blocks, "a block leaked or was freed twice"
        for _, path in locked:
            assert tree.match_prefix(path, record=False, touch=False).length == len(path), "locked prefix lost"
    for node, _ in locked:
        tree.unlock(node)
    tree.clear()
    assert pool.num_free == pool.num_blocks and tree.cached_blocks == 0


def test_lru_order_and_locks():
    pool = PagedKVPool(CFG, block_size=2, num_blocks=16)
    tree = RadixCache(pool, attach=False)
    seqs = {name: [i] * 4 for i, name in enumerate("abc")}
    for s in seqs.values():
        t = pool.alloc(2)
        tree.insert(s, t)
        pool.free(t)
    tree.match_prefix(seqs["a"])  # a becomes the most recent
    hit_c = tree.match_prefix(seqs["c"] + [9, 9])
    tree.lock(hit_c.node)
    tree.match_prefix(seqs["a"])
    assert tree.evict(1) == 1  # b is the LRU unlocked leaf: it loses its tail block first
    assert tree.match_prefix(seqs["b"], record=False, touch=False).length == 2
    assert tree.evict(1) == 1
    assert {s[0] for s in tree.cached_sequences()} == {0, 2}
    assert tree.evict(10) == 2  # only a can go; c is locked
    assert tree.cached_sequences() == [tuple(seqs["c"])]
    tree.unlock(hit_c.node)
    with pytest.raises(RuntimeError, match="unbalanced"):
        tree.unlock(hit_c.node)
    assert tree.clear() == 2 and pool.num_free == 16
    m = tree.metrics
    assert m.evictions == 4 and m.evicted_blocks == 6 and len(m.eviction_age_ticks) == 4


def test_split_keeps_the_lock_on_the_path():
    pool = PagedKVPool(CFG, block_size=1, num_blocks=16)
    tree = RadixCache(pool, attach=False)
    t = pool.alloc(6)
    tree.insert([1, 2, 3, 4, 5, 6], t)
    pool.free(t)
    whole = tree.match_prefix([1, 2, 3, 4, 5, 6, 7])
    tree.lock(whole.node)
    part = tree.match_prefix([1, 2, 3, 9])  # splits the locked edge after 3 tokens
    assert part.length == 3 and part.node.lock_ref == 1
    assert tree.evict(6) == 0
    tree.unlock(whole.node)
    assert part.node.lock_ref == 0 and tree.evict(6) == 6


def test_partial_blocks_are_never_cached():
    pool = PagedKVPool(CFG, block_size=4, num_blocks=8)
    tree = RadixCache(pool, attach=False)
    t = pool.alloc(3)
    res = tree.insert(list(range(10)), t)  # 2 whole blocks + 2 tokens
    assert res.inserted == 8 and pool.refcount[t[2]] == 1 and pool.refcount[t[0]] == 2
    pool.free(t)
    assert tree.match_prefix(list(range(10))).length == 8
    assert tree.match_prefix(list(range(7))).length == 4


def test_pool_evicts_through_the_tree_when_full():
    pool = PagedKVPool(CFG, block_size=1, num_blocks=6)
    tree = make_prefix_cache("radix", pool)
    t = pool.alloc(5)
    tree.insert([1, 2, 3, 4, 5], t)
    pool.free(t)
    got = pool.alloc(4)  # needs 3 of the cached blocks back: the leaf's tail goes, its head stays
    assert len(got) == 4 and tree.cached_blocks == 2 and tree.metrics.evicted_blocks == 3
    assert tree.match_prefix([1, 2, 3]).length == 2
    pool.free(got)
    pool.check_accounting()


def test_make_prefix_cache_and_no_sharing_baseline():
    pool = PagedKVPool(CFG, block_size=2, num_blocks=4)
    with pytest.raises(StudylibError, match="unknown prefix cache 'lru'"):
        make_prefix_cache("lru", pool)
    none = make_prefix_cache("none", pool)
    assert isinstance(none, NoPrefixCache)
    t = pool.alloc(2)
    none.insert([1, 2, 3, 4], t)
    assert pool.refcount[t[0]] == 1  # the baseline never holds a block
    res = none.match_prefix([1, 2, 3, 4])
    assert res.length == 0 and res.blocks == [] and none.metrics.miss_tokens == 4
    none.lock(res.node)
    none.unlock(res.node)
    assert none.evict(2) == 0
    pool.free(t)
    assert pool.num_free == 4
