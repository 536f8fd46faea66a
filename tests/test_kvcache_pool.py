"""The paged KV pool: allocation, reference counts, budgets and the two kinds of "full"."""

import pytest
import torch

from studylib.errors import StudylibError
from studylib.kvcache import PagedKVPool, PoolExhausted
from studylib.models.presets import tiny_config

CFG = tiny_config()


def snapshot(pool):
    return list(pool._free), list(pool.refcount)


def test_budget_sets_block_count():
    per_token = CFG.kv_bytes_per_token(4)  # 2 * layers * kv_heads * head_dim * 4 bytes
    pool = PagedKVPool(CFG, block_size=4, budget_bytes=per_token * 4 * 10 + 7)
    assert pool.bytes_per_block == per_token * 4
    assert pool.num_blocks == 10 and pool.num_free == 10
    assert pool.k[0].shape == (10, 4, CFG.num_kv_heads, CFG.head_dim)
    assert pool.nbytes <= per_token * 4 * 10 + 7


def test_bad_sizes_are_user_errors():
    with pytest.raises(StudylibError, match="block_size"):
        PagedKVPool(CFG, block_size=0, num_blocks=4)
    with pytest.raises(StudylibError, match="exactly one"):
        PagedKVPool(CFG, block_size=4)
    with pytest.raises(StudylibError, match="holds no block"):
        PagedKVPool(CFG, block_size=4, budget_bytes=10)


def test_alloc_free_refcounts():
    pool = PagedKVPool(CFG, block_size=2, num_blocks=5)
    a = pool.alloc(3)
    assert len(set(a)) == 3 and pool.num_free == 2 and all(pool.refcount[b] == 1 for b in a)
    pool.incref(a[:1])  # a second owner shares the first block
    assert pool.decref(a) == 2  # the shared block survives
    assert pool.num_free == 4 and pool.refcount[a[0]] == 1
    assert pool.free(a[:1]) == 1
    assert pool.num_free == 5
    pool.check_accounting()


def test_double_free_and_use_after_free_are_caught():
    pool = PagedKVPool(CFG, block_size=2, num_blocks=3)
    a = pool.alloc(1)
    pool.free(a)
    with pytest.raises(RuntimeError, match="double free"):
        pool.free(a)
    with pytest.raises(RuntimeError, match="use-after-free"):
        pool.incref(a)
    b = pool.alloc(1)
    with pytest.raises(RuntimeError, match="double free"):
        pool.decref(b + b)  # one reference, released twice in one call
    assert pool.refcount[b[0]] == 1  # the failed call changed nothing
    pool.check_accounting()


def test_request_larger_than_pool_is_a_clear_error_and_changes_nothing():
    pool = PagedKVPool(CFG, block_size=4, num_blocks=3)
    held = pool.alloc(1)
    before = snapshot(pool)
    with pytest.raises(StudylibError, match="whole pool holds 3 blocks") as err:
        pool.alloc(4)
    assert not isinstance(err.value, PoolExhausted)
    with pytest.raises(StudylibError, match="13 tokens"):
        pool.check_fits(13)
    pool.check_fits(12)
    assert snapshot(pool) == before
    pool.free(held)


def test_temporarily_full_raises_pool_exhausted_and_changes_nothing():
    pool = PagedKVPool(CFG, block_size=4, num_blocks=3)
    held = pool.alloc(2)
    before = snapshot(pool)
    with pytest.raises(PoolExhausted):
        pool.alloc(2)
    assert snapshot(pool) == before
    pool.free(held)
    assert len(pool.alloc(3)) == 3


def test_reclaimer_is_asked_before_giving_up():
    pool = PagedKVPool(CFG, block_size=1, num_blocks=4)
    parked = pool.alloc(3)
    asked = []

    def reclaim(n):
        asked.append(n)
        return pool.decref(parked[:n])

    pool.reclaimer = reclaim
    got = pool.alloc(2)
    assert asked == [1] and len(got) == 2 and pool.num_free == 0
    pool.check_accounting()


def test_slot_addressing_page_size_one_and_larger():
    for bs in (1, 3):
        pool = PagedKVPool(CFG, block_size=bs, num_blocks=8)
        table = [5, 2, 7]
        slots = pool.slots(table, 0, 3 * bs).tolist()
        expect = [b * bs + j for b in table for j in range(bs)]
        assert slots == expect
        pool.k_slots(0)[torch.tensor(slots)] = torch.arange(3 * bs, dtype=torch.float32)[:, None, None]
        k, _ = pool.read(0, table, 3 * bs)  # (kv_heads, length, head_dim)
        assert k[0, :, 0].tolist() == list(range(3 * bs))
        with pytest.raises(ValueError):
            pool.slots(table, 0, 3 * bs + 1)
