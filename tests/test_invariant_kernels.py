"""The batch-invariant C kernels (studylib.models.invariant): correct against PyTorch, and each
output's bits independent of the batch it is computed in, on every code path this CPU has."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from studylib.models import invariant

ok, why = invariant.available()
pytestmark = pytest.mark.skipif(not ok, reason=f"invariant kernels unavailable: {why}")
ORDER = ["scalar", "avx2", "avx512"]
PATHS = ORDER[: ORDER.index(invariant.best_isa()) + 1] if ok else []


@pytest.fixture(params=PATHS)
def isa(request, monkeypatch):
    monkeypatch.setenv("STUDYLIB_INVARIANT_ISA", request.param)
    return request.param


def test_gemm_matches_linear_and_is_row_invariant(isa):
    torch.manual_seed(0)
    for n, k in ((70, 40), (33, 19), (96, 64)):  # N not a multiple of the 32-column panel; odd K
        w, b, x = torch.randn(n, k), torch.randn(n), torch.randn(41, k)
        full = invariant.gemm(x, w, b)
        torch.testing.assert_close(full, F.linear(x, w, b), rtol=1e-5, atol=1e-4)
        for m in (1, 2, 3, 7, 8, 9, 17):
            for off in (0, 5, 41 - m):
                assert torch.equal(invariant.gemm(x[off : off + m], w, b), full[off : off + m]), (isa, m, off)


def test_gemm_code_paths_agree_bit_for_bit(monkeypatch):
    torch.manual_seed(1)
    w, x = torch.randn(77, 50), torch.randn(13, 50)
    outs = {}
    for path in PATHS:
        monkeypatch.setenv("STUDYLIB_INVARIANT_ISA", path)
        w2 = w.clone()  # a fresh tensor, so no packed copy is shared between paths
        outs[path] = invariant.gemm(x, w2)
    first = outs[PATHS[0]]
    assert all(torch.equal(first, o) for o in outs.values()), list(outs)


def test_gemm_repacks_when_the_weight_changes_in_place():
    w, x = torch.randn(40, 16), torch.randn(3, 16)
    before = invariant.gemm(x, w)
    w.mul_(2)
    torch.testing.assert_close(invariant.gemm(x, w), 2 * before)


def _ragged(seed: int, cached: list[int], new: list[int], hkv: int = 2, h: int = 6, d: int = 16):
    """A random store of slots and a ragged batch over it; each sequence's slots are scattered."""
    gen = torch.Generator().manual_seed(seed)
    total = [c + n for c, n in zip(cached, new, strict=True)]
    num_slots = sum(total) + 7
    perm = torch.randperm(num_slots, generator=gen)
    slots, start = [], 0
    for t in total:
        slots.append(perm[start : start + t])
        start += t
    k = torch.randn(num_slots, hkv, d, generator=gen)
    v = torch.randn(num_slots, hkv, d, generator=gen)
    q = torch.randn(sum(new), h, d, generator=gen)
    return q, k, v, slots


def _call(q, k, v, slots, cached, new):
    tok_off = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()])
    slot_off = torch.tensor([0, *torch.tensor([c + n for c, n in zip(cached, new, strict=True)]).cumsum(0).tolist()])
    return invariant.attention(q, k, v, k.stride(0), k.stride(1), torch.cat(slots), slot_off, tok_off,
                               torch.tensor(cached), k.shape[1])


def test_attention_matches_sdpa_and_is_batch_invariant(isa):
    cached, new = [0, 5, 12, 3], [4, 1, 6, 1]
    q, k, v, slots = _ragged(0, cached, new)
    out = _call(q, k, v, slots, cached, new)
    off = 0
    for i, (c, n) in enumerate(zip(cached, new, strict=True)):
        ks, vs = k[slots[i]].transpose(0, 1)[None], v[slots[i]].transpose(0, 1)[None]  # (1, Hkv, L, D)
        qi = q[off : off + n].transpose(0, 1)[None]  # (1, H, n, D)
        mask = torch.arange(c + n)[None, :] <= torch.arange(c, c + n)[:, None]
        ref = F.scaled_dot_product_attention(qi, ks, vs, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)
        torch.testing.assert_close(out[off : off + n], ref, rtol=1e-5, atol=1e-5)
        # The same sequence alone, and each of its queries alone as a decode step: the same bits.
        alone = _call(q[off : off + n], k, v, [slots[i]], [c], [n])
        assert torch.equal(alone, out[off : off + n])
        for j in range(n):
            one = _call(q[off + j : off + j + 1], k, v, [slots[i][: c + j + 1]], [c + j], [1])
            assert torch.equal(one[0], out[off + j])
        off += n


def test_dense_cache_and_paged_pool_give_the_same_bits(tiny):
    """The single-request decoder's dense cache and the engine's paged pool (scattered blocks, a
    chunked prefill beside another sequence) compute bit-identical logits under the kernels."""
    from studylib.kvcache import PagedBatch, PagedKVPool
    from studylib.models import DenseKVCache

    model, _ = tiny
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(3, 259, (n,), generator=gen).tolist() for n in (21, 11))
    with torch.inference_mode(), invariant.enabled():
        dense = DenseKVCache(model.config, 1, 32)
        alone = model(torch.tensor([a]), dense.begin(len(a)), logits="last").logits[0, -1]
        pool = PagedKVPool(model.config, block_size=4, num_blocks=32)
        tb = pool.alloc(pool.blocks_for(len(b)))
        ta = pool.alloc(pool.blocks_for(len(a)))[::-1]  # blocks out of order: read through the table
        view = PagedBatch(pool, [tb, ta], [0, 0], [len(b), 8])
        assert view.mode == "kernel"
        model(torch.tensor([b + a[:8]]), view, logits="none")
        view = PagedBatch(pool, [ta], [8], [len(a) - 8])
        chunked = model(torch.tensor([a[8:]]), view, logits=view.logit_index()).logits[0, 0]
    assert torch.equal(alone, chunked)


def test_outside_the_context_nothing_changes(tiny):
    model, _ = tiny
    assert not invariant.active()
    with invariant.enabled():
        assert invariant.active()
    assert not invariant.active()


def test_isa_override_is_checked(monkeypatch):
    from studylib.errors import StudylibError

    monkeypatch.setenv("STUDYLIB_INVARIANT_ISA", "sse9")
    with pytest.raises(StudylibError, match="STUDYLIB_INVARIANT_ISA"):
        invariant.isa()
