"""The clairvoyant reference of chapter 4: Belady's farthest-next-use rule under the tree constraint."""

import functools
import itertools
import random

import pytest

from studylib.errors import StudylibError
from studylib.kvcache.belady import ROOT, Trace, belady_hits, simulate
from studylib.kvcache.replay import compare_policies, min_pool_blocks, replay_hits, working_set_blocks
from studylib.workloads.prefix import optimal_hits


def random_trace(rng, n, alphabet=3, repeat=0.1):
    """Shared-prefix requests: most extend a cut of an earlier prompt (or prompt + reply, as a chat
    does) with a fresh suffix; a few are new or exact repeats. Each is (prompt, output)."""
    seqs = []
    for _ in range(n):
        if seqs and rng.random() < repeat:
            prompt, out = (list(x) for x in rng.choice(seqs))
        else:
            if seqs and rng.random() < 0.8:
                p0, o0 = rng.choice(seqs)
                base = p0 + (o0 if rng.random() < 0.4 else [])
                prompt = base[: rng.randint(0, len(base))]
            else:
                prompt = []
            prompt = prompt + [rng.randrange(alphabet) for _ in range(rng.randint(1, 5))]
            out = [rng.randrange(alphabet) for _ in range(rng.randint(0, 3))]
        seqs.append((prompt, out))
    return seqs


def system_prompt_trace(rng, n, bs):
    """A few long shared heads, each followed by a short random question and reply."""
    heads = [[rng.randrange(50) for _ in range(rng.randint(3, 6) * bs)] for _ in range(3)]
    return [(rng.choice(heads) + [rng.randrange(50) for _ in range(rng.randint(1, 2 * bs))],
             [rng.randrange(50) for _ in range(rng.randint(1, bs))]) for _ in range(n)]


def pool_sizes(seqs, bs):
    lo, ws = min_pool_blocks(seqs, bs), working_set_blocks(seqs, bs)
    return range(lo, max(ws, lo) + 1)


@pytest.mark.parametrize("seed", range(6))
def test_lru_model_reproduces_the_radix_cache(seed):
    """Belady shares its accounting with an LRU twin that must replay exactly as the real RadixCache does."""
    rng = random.Random(seed)
    for _ in range(8):
        bs = rng.choice([1, 2, 4])
        seqs = random_trace(rng, rng.randint(4, 12)) if bs < 4 else system_prompt_trace(rng, 10, bs)
        for nb in pool_sizes(seqs, bs):
            assert simulate(seqs, block_size=bs, num_blocks=nb, policy="lru")["hits"] == \
                replay_hits(seqs, block_size=bs, num_blocks=nb)["hits"], (seqs, bs, nb)


@pytest.mark.parametrize("seed", range(8))
def test_belady_never_below_lru(seed):
    rng = random.Random(100 + seed)
    strictly = 0
    for _ in range(10):
        bs = rng.choice([1, 2, 4])
        seqs = random_trace(rng, rng.randint(5, 14)) if bs < 4 else system_prompt_trace(rng, 12, bs)
        trace = Trace(seqs, bs)
        for nb in pool_sizes(seqs, bs):
            r = compare_policies(trace, block_size=bs, num_blocks=nb)
            assert r["belady"]["hit_tokens"] >= r["lru"]["hit_tokens"], (seqs, bs, nb)
            strictly += r["belady"]["hit_tokens"] > r["lru"]["hit_tokens"]
    assert strictly > 0  # the traces do put eviction to work


@pytest.mark.parametrize("seed", range(4))
def test_equals_the_never_evicting_optimum_when_the_pool_holds_everything(seed):
    rng = random.Random(200 + seed)
    for _ in range(10):
        bs = rng.choice([1, 2, 4])
        seqs = random_trace(rng, rng.randint(3, 12)) if bs < 4 else system_prompt_trace(rng, 10, bs)
        queries = [p[:-1] for p, _ in seqs]
        cached = [(p + o)[: len(p) + len(o) - 1] for p, o in seqs]
        best = optimal_hits(queries, cached, bs)
        ws = max(working_set_blocks(seqs, bs), min_pool_blocks(seqs, bs))
        for nb in (ws, ws + 3):
            b = belady_hits(seqs, block_size=bs, num_blocks=nb)
            assert b["hits"] == best and b["evicted_blocks"] == 0
            assert b["hits"] == replay_hits(seqs, block_size=bs, num_blocks=nb)["hits"]


def test_hand_built_trace_where_lru_thrashes():
    """Three prompts in a cycle, A B C A B C, and a pool for about two of them. LRU always evicts the
    prompt that comes next; Belady keeps what is needed soonest.

    Worked by hand (block size 1, prompts of 4 tokens, one output token, pool of 9 blocks): at C,
    LRU evicts A's last three blocks (oldest), so A hits 1 token, B then 1, C then 1. Belady evicts
    B's tail (needed later than A's) and blocks nobody queries again, so A hits 3, B 2, C 3."""
    a, b, c = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]
    seqs = [(p, [0]) for p in (a, b, c, a, b, c)]
    lru = replay_hits(seqs, block_size=1, num_blocks=9)
    bel = belady_hits(seqs, block_size=1, num_blocks=9)
    assert lru["hits"] == [0, 0, 0, 1, 1, 1]
    assert bel["hits"] == [0, 0, 0, 3, 2, 3]
    assert bel["hit_tokens"] > lru["hit_tokens"]


def _checker(log):
    """An on_evict hook that checks the constraints from the cache's state alone."""
    def check(cache, t, b):
        q = cache.trace.queries[t]
        hit = next((i for i, x in enumerate(q) if x not in cache.cached), len(q))
        assert b in cache.cached
        assert all(cache.parent[x] == ROOT or cache.parent[x] in cache.cached for x in cache.cached)  # a tree
        assert not any(cache.parent[x] == b for x in cache.cached), "evicted a block with a cached child"
        assert b not in q[:hit], "evicted a block the request being served reads"
        assert cache.locked == set(q[:hit])
        log.append((t, b))
    return check


@pytest.mark.parametrize("policy", ["belady", "lru"])
def test_evicts_only_unlocked_leaves(policy):
    rng = random.Random(7)
    log = []
    for _ in range(12):
        bs = rng.choice([1, 2, 4])
        seqs = random_trace(rng, 12) if bs < 4 else system_prompt_trace(rng, 12, bs)
        for nb in pool_sizes(seqs, bs):
            simulate(seqs, block_size=bs, num_blocks=nb, policy=policy, on_evict=_checker(log))
    assert len(log) > 50


def exhaustive_optimum(trace, num_blocks):
    """The best total hit tokens over every admissible schedule: at each request evict any set of
    unlocked blocks that leaves a tree (at least what the request needs, more if it likes), and after
    the insert drop any further subtree set (bypass). Exponential: tiny traces only."""
    parent, bs = trace.ids.parent, trace.block_size

    def removable(cached, locked, at_least):
        free = [b for b in cached if b not in locked]
        for r in range(at_least, len(free) + 1):
            for drop in map(frozenset, itertools.combinations(free, r)):
                if all(parent[x] == ROOT or parent[x] not in drop for x in cached - drop):
                    yield drop

    @functools.cache
    def best(t, cached):
        if t == len(trace):
            return 0
        q = trace.queries[t]
        h = next((i for i, x in enumerate(q) if x not in cached), len(q))
        over = len(cached) + -(-trace.kv_lens[t] // bs) - h - num_blocks
        out = max(best(t + 1, after - drop)
                  for first in removable(cached, set(q[:h]), max(over, 0))
                  for after in [(cached - first) | frozenset(trace.kv_blocks[t])]
                  for drop in removable(after, set(), 0))
        return h * bs + out

    return best(0, frozenset())


def test_matches_exhaustive_search_on_tiny_traces():
    """Not a proof of optimality (see the module docstring), but no counterexample on these traces."""
    rng = random.Random(11)
    checked = 0
    while checked < 40:
        bs = rng.choice([1, 2])
        seqs = random_trace(rng, rng.randint(3, 6))
        trace = Trace(seqs, bs)
        if len({b for s in trace.kv_blocks for b in s}) > 10:
            continue
        for nb in pool_sizes(seqs, bs):
            assert belady_hits(trace, block_size=bs, num_blocks=nb)["hit_tokens"] == \
                exhaustive_optimum(trace, nb), (seqs, bs, nb)
            checked += 1


def test_rejects_a_pool_too_small_for_one_request():
    with pytest.raises(StudylibError, match="raise the pool size"):
        belady_hits([([1, 2, 3, 4], [5])], block_size=1, num_blocks=4)
    with pytest.raises(StudylibError, match="unknown eviction policy"):
        simulate([([1, 2], [3])], block_size=1, num_blocks=4, policy="fifo")
