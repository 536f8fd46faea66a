"""Paged attention and the prefix-cached decoder against the contiguous cache and plain AR decoding."""

import random

import pytest
import torch

from studylib.decoding import ar
from studylib.errors import StudylibError
from studylib.kvcache import PagedBatch, PagedKVPool
from studylib.kvcache.prefix_generate import PrefixCachedDecoder
from studylib.models import DenseKVCache, load_model
from studylib.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")[0]


def dense_logits(model, seq):
    cache = DenseKVCache(model.config, 1, len(seq))
    return model(torch.tensor([seq]), cache.begin(len(seq))).logits[0]  # (T, V)


def rand_seqs(lengths, seed=0):
    g = random.Random(seed)
    return [[g.randrange(3, 250) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("mode", ["loop", "padded"])
@pytest.mark.parametrize("bs", [1, 3, 16])
def test_ragged_batch_matches_dense(tiny, mode, bs):
    seqs = rand_seqs([37, 5, 20])
    pool = PagedKVPool(tiny.config, block_size=bs, num_blocks=200)
    tables = [pool.alloc(pool.blocks_for(len(s) + 1)) for s in seqs]
    tables[0] = tables[0][::-1]  # scattered blocks (read by gather); the others are consecutive (a view)
    cut = [len(s) - 3 for s in seqs]
    # Step 1: a ragged prefill of each sequence's head; step 2: 3 more tokens each, on top of the cache.
    flat1 = torch.tensor([[t for s, c in zip(seqs, cut, strict=True) for t in s[:c]]])
    v1 = PagedBatch(pool, tables, [0, 0, 0], cut, mode=mode)
    out1 = tiny(flat1, v1).logits[0]
    flat2 = torch.tensor([[t for s, c in zip(seqs, cut, strict=True) for t in s[c:]]])
    v2 = PagedBatch(pool, tables, cut, [3, 3, 3], mode=mode)
    out2 = tiny(flat2, v2, logits=v2.logit_index()).logits[0]  # (3, V): each sequence's last token
    for i, s in enumerate(seqs):
        ref = dense_logits(tiny, s)
        torch.testing.assert_close(out1[v1.offsets[i] : v1.offsets[i + 1]], ref[: cut[i]])
        torch.testing.assert_close(out2[i], ref[-1])
    # A decode step: one token per sequence.
    nxt = [g.argmax().item() for g in out2]
    v3 = PagedBatch(pool, tables, [len(s) for s in seqs], [1, 1, 1], mode=mode)
    out3 = tiny(torch.tensor([nxt]), v3).logits[0]
    for i, s in enumerate(seqs):
        torch.testing.assert_close(out3[i], dense_logits(tiny, s + [nxt[i]])[-1])


def test_prefix_hit_plus_suffix_prefill_equals_full_prefill_kv(tiny):
    prefix, suffix = rand_seqs([24, 9], seed=1)
    pool = PagedKVPool(tiny.config, block_size=4, num_blocks=40)
    full = pool.alloc(pool.blocks_for(33))
    tiny(torch.tensor([prefix + suffix]), PagedBatch(pool, [full], [0], [33]), logits="none")
    shared = full[:6]  # the 24 prefix tokens, as a cache hit would hand them over
    pool.incref(shared)
    warm = shared + pool.alloc(3)
    tiny(torch.tensor([suffix]), PagedBatch(pool, [warm], [24], [9]), logits="none")
    for layer in range(tiny.config.num_layers):
        k_full, v_full = pool.read(layer, full, 33)
        k_warm, v_warm = pool.read(layer, warm, 33)
        torch.testing.assert_close(k_warm, k_full)
        torch.testing.assert_close(v_warm, v_full)


def test_mask_fn_hook_matches_dense(tiny):
    def window(q, k):  # the last 4 positions only (DenseKVCache.mask_fn signature)
        return k[..., None, :] > q[..., :, None] - 4

    seq = rand_seqs([19], seed=2)[0]
    dense = DenseKVCache(tiny.config, 1, 19)
    dense.mask_fn = window
    ref = tiny(torch.tensor([seq]), dense.begin(19)).logits[0]
    for mode in ("loop", "padded"):
        pool = PagedKVPool(tiny.config, block_size=4, num_blocks=8)
        t = pool.alloc(5)
        a = tiny(torch.tensor([seq[:11]]), PagedBatch(pool, [t], [0], [11], mode=mode, mask_fn=window)).logits[0]
        b = tiny(torch.tensor([seq[11:]]), PagedBatch(pool, [t], [11], [8], mode=mode, mask_fn=window)).logits[0]
        torch.testing.assert_close(torch.cat([a, b]), ref)


def shared_prompts(n, stem=70, seed=0):
    g = random.Random(seed)
    system = [g.randrange(3, 250) for _ in range(stem)]
    return [system + [g.randrange(3, 250) for _ in range(g.randrange(1, 30))] for _ in range(n)]


@pytest.mark.parametrize("cache", ["none", "radix"])
@pytest.mark.parametrize("bs,chunk", [(1, None), (4, None), (16, 32)])
def test_greedy_with_and_without_cache_equals_ar(tiny, cache, bs, chunk):
    prompts = shared_prompts(5)
    dec = PrefixCachedDecoder(tiny, cache, block_size=bs, capacity_tokens=400, prefill_chunk=chunk)
    for i, p in enumerate(prompts):
        got = dec.generate(p, 12)
        assert got.token_ids == ar.generate(tiny, p, 12).token_ids
        hit = got.extra["prefix_hit_tokens"]
        if cache == "none" or i == 0:
            assert hit == 0
        else:
            grid = chunk or bs
            assert hit == 70 // grid * grid  # the shared stem, in whole blocks / chunks
        assert got.extra["prefill_tokens"] == len(p) - hit
    dec.pool.check_accounting()
    held = dec.cache.cached_blocks
    assert dec.pool.num_used == held  # nothing but the cache holds blocks between requests


def test_chunked_prefill_is_bitwise_identical_cold_and_warm(tiny):
    prompts = shared_prompts(4, stem=90, seed=3)
    sp = SamplingParams(temperature=0.9, seed=7)
    cold = PrefixCachedDecoder(tiny, "none", block_size=8, prefill_chunk=16)
    warm = PrefixCachedDecoder(tiny, "radix", block_size=8, prefill_chunk=16)
    for p in prompts:
        a, b = cold.generate(p, 10, sp), warm.generate(p, 10, sp)
        assert a.token_ids == b.token_ids
    assert warm.cache.metrics.hit_tokens > 0


def test_page_size_one_and_eviction_under_a_small_budget(tiny):
    prompts = shared_prompts(6, stem=40, seed=4)
    dec = PrefixCachedDecoder(tiny, "radix", block_size=1, capacity_tokens=120)
    for p in prompts:
        assert dec.generate(p, 8).token_ids == ar.generate(tiny, p, 8).token_ids
    assert dec.cache.metrics.evictions > 0 and dec.pool.num_used <= 120
    dec.pool.check_accounting()


def test_request_larger_than_the_pool_is_rejected_and_pool_stays_intact(tiny):
    dec = PrefixCachedDecoder(tiny, "radix", block_size=4, capacity_tokens=64)
    p = shared_prompts(1, stem=30)[0]
    dec.generate(p, 4)
    before = (list(dec.pool._free), list(dec.pool.refcount), dec.cache.cached_sequences())
    with pytest.raises(StudylibError, match="whole pool holds 16 blocks"):
        dec.generate(p + [5] * 40, 10)
    assert (list(dec.pool._free), list(dec.pool.refcount), dec.cache.cached_sequences()) == before
    assert dec.generate(p, 4).extra["prefix_hit_tokens"] > 0  # still serving, cache still warm


def test_bad_decoder_options(tiny):
    with pytest.raises(StudylibError, match="multiple of block_size"):
        PrefixCachedDecoder(tiny, block_size=16, prefill_chunk=24)
    with pytest.raises(StudylibError, match="unknown prefix cache"):
        PrefixCachedDecoder(tiny, cache="lru")


@pytest.mark.slow
def test_smollm2_greedy_with_cache_equals_without_and_ar():
    model, tok = load_model("smollm2-135m")
    system = "You are a careful assistant. Answer in one short sentence. " * 6
    prompts = [tok(system + q)["input_ids"] for q in ("What is the capital of France?", "Name a prime number.",
                                                       "What colour is the sky?")]
    radix = PrefixCachedDecoder(model, "radix", block_size=16, tokenizer=tok)
    plain = PrefixCachedDecoder(model, "none", block_size=16, tokenizer=tok)
    for p in prompts:
        want = ar.generate(model, p, 16, tokenizer=tok).token_ids
        assert plain.generate(p, 16).token_ids == want
        assert radix.generate(p, 16).token_ids == want
    assert radix.cache.metrics.hit_tokens > 0
