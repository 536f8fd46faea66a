"""Soak: hundreds of random requests through a tiny pool, with aborts, preemption and eviction.

It must end with every request finished or aborted, no block leaked or double-freed (reference
counts equal the owners we can see at every step), and nobody starved. Bounded: a fixed number of
requests and a step cap, on tiny-random.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from studylib.models import load_model
from studylib.serving import Engine, EngineConfig, Request, RequestStatus
from studylib.serving.check import ar_references, divergence

N_REQUESTS = 520
STEP_CAP = 20_000


def tree_blocks(cache) -> list[int]:
    out, stack = [], [cache.root]
    while stack:
        node = stack.pop()
        out.extend(node.blocks)
        stack.extend(node.children.values())
    return out


def check_refcounts(engine: Engine) -> None:
    """Every block's reference count is exactly its visible owners: running requests + the tree."""
    owners = Counter(tree_blocks(engine.prefix_cache))
    for r in engine.scheduler.running:
        owners.update(r.block_table)
    for r in engine.scheduler.waiting:
        assert r.block_table == [], f"waiting request {r.id} holds blocks"
    pool = engine.pool
    pool.check_accounting()
    for b in range(pool.num_blocks):
        assert pool.refcount[b] == owners.get(b, 0), f"block {b}: refcount {pool.refcount[b]}, owners {owners[b]}"


@pytest.mark.slow
@pytest.mark.parametrize("cache_aware", [False, True])
def test_soak_random_requests_aborts_preemption_eviction(cache_aware):
    model, _ = load_model("tiny-random")
    rng = random.Random(1234 + cache_aware)
    stems = [[rng.randrange(3, 259) for _ in range(rng.randint(4, 24))] for _ in range(6)]

    def make(i: int) -> Request:
        if rng.random() < 0.02:  # can never fit: must be rejected at arrival, not wedge the engine
            return Request(f"r{i}", [rng.randrange(3, 259) for _ in range(300)], 4)
        stem = rng.choice(stems) if rng.random() < 0.7 else []
        tail = [rng.randrange(3, 259) for _ in range(rng.randint(1, 20))]
        return Request(f"r{i}", stem + tail, rng.randint(1, 16), ignore_eos=rng.random() < 0.5)

    # 40 blocks of 4 tokens = 160 slots: far less than the working set, so the tree evicts and
    # running requests get preempted all the time.
    config = EngineConfig(scheduler="continuous", prefix_cache="radix", cache_aware=cache_aware, block_size=4,
                          num_blocks=40, kv_budget_mib=None, max_batch_tokens=48, chunk_size=16, max_running=12)
    engine = Engine(model, config)
    reqs = [make(i) for i in range(N_REQUESTS)]
    pending = list(reqs)
    admitted_step: dict[str, int] = {}
    steps = 0
    while pending or engine.has_work():
        assert steps < STEP_CAP, "the engine stopped making progress"
        for _ in range(rng.randint(0, 3)):
            if pending:
                r = pending.pop(0)
                if engine.submit(r):
                    admitted_step[r.id] = steps
        if rng.random() < 0.08:
            live = [r for r in reqs if r.id in admitted_step and not r.status.done]
            if live:
                engine.abort(rng.choice(live).id)
        engine.step()
        steps += 1
        if steps % 7 == 0:
            check_refcounts(engine)

    statuses = Counter(r.status for r in reqs)
    assert set(statuses) <= {RequestStatus.FINISHED, RequestStatus.ABORTED}
    rejected = [r for r in reqs if r.stop_reason == "rejected"]
    assert rejected and all("pool" in r.error for r in rejected)
    finished = [r for r in reqs if r.status is RequestStatus.FINISHED]
    assert len(finished) > N_REQUESTS // 2
    for r in finished:
        assert 1 <= len(r.output_ids) <= r.max_new_tokens
        assert r.stop_reason == "eos" or len(r.output_ids) == r.max_new_tokens
    # The soak really exercised what it is meant to.
    assert engine.scheduler.num_preemptions > 0
    assert engine.prefix_cache.metrics.evictions > 0
    assert sum(r.prefix_hit_tokens for r in reqs) > 0
    # No leak: once the tree lets go, the whole pool is free again.
    check_refcounts(engine)
    engine.prefix_cache.clear()
    assert engine.pool.num_free == engine.pool.num_blocks
    # Outputs stay lossless through preemption and eviction (a sample, against single-request AR).
    sample = [Request(r.id, r.prompt_ids, r.max_new_tokens, ignore_eos=r.ignore_eos)
              for r in rng.sample([r for r in finished if r.num_preemptions] or finished, 12)]
    refs = ar_references(model, sample)
    got = {r.id: r.output_ids for r in finished}
    outs = [got[r.id] for r in sample]
    cut = [ref[: len(o)] if r.ignore_eos else ref for ref, o, r in zip(refs, outs, sample, strict=True)]
    assert divergence([o[: len(c)] for o, c in zip(outs, cut, strict=True)], cut)["divergence_rate"] <= 0.1
