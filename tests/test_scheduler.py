"""Scheduler policies and block bookkeeping, driven without a model: each step's ``{id: num_tokens}``
decision is checked, and a fake "forward" returns a fixed token for every request that needs one."""

from __future__ import annotations

import pytest

from studylib.errors import StudylibError
from studylib.kvcache import PagedKVPool, make_prefix_cache
from studylib.models.presets import tiny_config
from studylib.serving.blocks import BlockManager
from studylib.serving.request import Request, RequestStatus
from studylib.serving.scheduler import Scheduler, SchedulerConfig

CFG = tiny_config(0)


def make(policy="continuous", *, num_blocks=64, block_size=4, prefix="none", **kw):
    pool = PagedKVPool(CFG, block_size=block_size, num_blocks=num_blocks)
    cache = make_prefix_cache(prefix, pool)
    sched = Scheduler(SchedulerConfig(policy, prefix_cache=prefix, **kw), BlockManager(pool, cache))
    return sched, pool, cache


def req(rid, n_prompt, n_new=4, start=10):
    return Request(rid, list(range(start, start + n_prompt)), n_new, eos_ids=frozenset({2}))


def step(sched, token=7):
    out = sched.schedule()
    done = sched.update_from_output(out, {rid: token for rid in out.num_tokens}, now=0.0)
    return out, done


def drain(sched, limit=1000):
    for _ in range(limit):
        if not sched.has_work():
            return
        step(sched)
    raise AssertionError("scheduler did not drain")


def test_prefill_then_decode_in_one_contract():
    s, pool, _ = make()
    s.add(req("a", 10))
    s.add(req("b", 6))
    out, _ = step(s)
    assert out.num_tokens == {"a": 10, "b": 6}
    out, _ = step(s)
    assert out.num_tokens == {"a": 1, "b": 1}
    assert s.requests["a"].output_ids == [7, 7]
    assert s.requests["a"].num_computed == 11
    drain(s)
    assert all(r.status is RequestStatus.FINISHED and len(r.output_ids) == 4 for r in s.requests.values())
    assert pool.num_free == pool.num_blocks
    pool.check_accounting()


def test_chunked_prefill_respects_chunk_and_token_budget():
    s, _, _ = make(max_batch_tokens=6, chunk_size=4)
    s.add(req("a", 10))
    s.add(req("b", 6))
    seen = []
    while not s.requests["a"].output_ids:
        out, _ = step(s)
        seen.append(dict(out.num_tokens))
        assert out.total_tokens <= 6 and max(out.num_tokens.values()) <= 4
    # a's prompt went through in chunks 4, 4, 2; b filled the budget left over each step.
    assert [d["a"] for d in seen] == [4, 4, 2]
    assert seen[0]["b"] == 2
    assert s.requests["a"].num_computed == 10


def test_continuous_admits_while_others_decode():
    s, _, _ = make()
    s.add(req("a", 5, n_new=8))
    step(s)
    step(s)  # a is decoding
    s.add(req("b", 7))
    out, _ = step(s)
    assert out.num_tokens == {"a": 1, "b": 7}


def test_sequential_runs_one_request_at_a_time():
    s, _, _ = make("sequential", max_running=8)
    s.add(req("a", 5, n_new=3))
    s.add(req("b", 5, n_new=3))
    order = []
    while s.has_work():
        out, _ = step(s)
        assert len(out.num_tokens) == 1
        order.extend(out.num_tokens)
    assert order == ["a"] * 3 + ["b"] * 3


def test_static_batch_runs_to_completion_before_the_next():
    s = Scheduler(SchedulerConfig("static", max_running=2))
    s.add(req("a", 5, n_new=1))  # finishes right after the batch's prefill
    s.add(req("b", 3, n_new=4))
    s.add(req("c", 4, n_new=1))
    out, done = step(s)
    assert out.new_batch == ["a", "b"] and out.num_tokens == {"a": 5, "b": 3}
    assert [r.id for r in done] == ["a"]
    # c waits although a's row is free: the batch runs to completion.
    for _ in range(3):
        out, _ = step(s)
        assert out.num_tokens == {"b": 1} and out.new_batch is None
    out, _ = step(s)
    assert out.new_batch == ["c"]


def test_static_batch_size_is_capped_by_the_dense_memory_budget():
    # Each row reserves longest prompt + longest output = 10 + 6 slots; 40 slots fit two rows.
    s = Scheduler(SchedulerConfig("static", max_running=8), dense_capacity=40)
    for i in range(4):
        s.add(req(str(i), 10, n_new=6))
    out, _ = step(s)
    assert out.new_batch == ["0", "1"]


def test_preemption_by_recompute_when_the_pool_is_exhausted():
    # 6 blocks of 4 slots; two requests of 8 prompt tokens fill 4 blocks, decoding needs more.
    s, pool, _ = make(num_blocks=6, block_size=4)
    a, b = req("a", 8, n_new=12), req("b", 8, n_new=12, start=40)
    s.add(a)
    s.add(b)
    preempted = []
    while s.has_work():
        out, _ = step(s)
        preempted += out.preempted
        pool.check_accounting()
        held = sum(len(r.block_table) for r in s.running)
        assert held == pool.num_used  # nothing leaks, nothing is shared here
    assert preempted and preempted[0] == "b"  # the youngest goes first
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    assert len(a.output_ids) == len(b.output_ids) == 12
    assert pool.num_free == pool.num_blocks


def test_preempted_request_keeps_its_tokens_and_recomputes_them():
    s, _, _ = make(num_blocks=6, block_size=4)
    a, b = req("a", 8, n_new=12), req("b", 8, n_new=12, start=40)
    s.add(a)
    s.add(b)
    while "b" not in step(s)[0].preempted:
        pass
    assert b.status is RequestStatus.WAITING and s.waiting[0] is b
    kept = list(b.output_ids)
    assert b.num_computed == 0 and b.block_table == [] and kept
    while b.status is not RequestStatus.RUNNING:
        out, _ = step(s)
    # Readmitted: the recompute prefill covers the prompt plus every token generated so far.
    assert out.num_tokens["b"] == 8 + len(kept)
    assert b.output_ids[: len(kept)] == kept


def test_prefix_hit_is_block_aligned_and_leaves_the_last_token():
    s, pool, cache = make(prefix="radix", block_size=4)
    s.add(req("a", 10, n_new=2))
    drain(s)
    s.add(req("b", 10, n_new=2))  # the same prompt
    out, _ = step(s)
    b = s.requests["b"]
    assert b.prefix_hit_tokens == 8  # (10 - 1) // 4 * 4: block 3 (tokens 8, 9) is recomputed
    assert out.num_tokens == {"b": 2}
    drain(s)
    cache.clear()
    pool.check_accounting()
    assert pool.num_free == pool.num_blocks


def test_running_prefix_is_shared_with_later_arrivals():
    s, pool, _ = make(prefix="radix", block_size=4)
    s.add(req("a", 12, n_new=8))
    step(s)  # a's prompt is done and inserted while a keeps decoding
    s.add(req("b", 12, n_new=2))
    step(s)
    a, b = s.requests["a"], s.requests["b"]
    assert b.prefix_hit_tokens == 8
    assert b.block_table[:2] == a.block_table[:2]  # one physical copy
    assert all(pool.refcount[blk] == 3 for blk in a.block_table[:2])  # a, b and the tree


def test_cache_aware_admission_prefers_the_longest_cached_prefix():
    for aware, first in ((False, "x"), (True, "y")):
        s, _, _ = make("continuous", prefix="radix", block_size=4, max_running=1, cache_aware=aware)
        s.add(req("warm", 12, n_new=1))
        drain(s)
        s.add(req("x", 12, n_new=1, start=100))  # no match
        s.add(req("y", 12, n_new=1))  # matches the warm prompt
        out, _ = step(s)
        assert list(out.num_tokens) == [first]


def test_abort_returns_blocks_at_once_and_leaves_others_running():
    s, pool, _ = make()
    s.add(req("a", 9, n_new=20))
    s.add(req("b", 9, n_new=5))
    step(s)
    s.abort("a", now=1.0)
    a = s.requests["a"]
    assert a.status is RequestStatus.ABORTED and a.stop_reason == "abort" and a.block_table == []
    drain(s)
    assert s.requests["b"].status is RequestStatus.FINISHED
    assert pool.num_free == pool.num_blocks
    assert s.abort("a", now=2.0) is None  # already done: ignored


def test_duplicate_ids_are_rejected():
    s, _, _ = make()
    s.add(req("a", 3))
    with pytest.raises(StudylibError, match="already"):
        s.add(req("a", 3))


@pytest.mark.parametrize("kw, match", [
    (dict(policy="static", prefix_cache="radix"), "static"),
    (dict(policy="continuous", max_batch_tokens=8, chunk_size=16), "chunk_size"),
    (dict(policy="continuous", cache_aware=True), "radix"),
    (dict(policy="fifo"), "unknown scheduler"),
])
def test_config_validation(kw, match):
    with pytest.raises(StudylibError, match=match):
        SchedulerConfig(**kw)
