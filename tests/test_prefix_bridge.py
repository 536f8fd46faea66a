"""Dense-cache decoders stacked with the radix prefix cache give the same tokens, with fewer prefilled."""

from __future__ import annotations

import torch

from studylib.decoding import ar
from studylib.kvcache.dense_bridge import PrefixStore, prefill


def test_loaded_prefix_equals_full_prefill(tiny):
    model, tok = tiny
    store = PrefixStore(model, capacity_tokens=512, block_size=4)
    shared = tok.encode("a long shared system prompt that many requests start with. ")
    a, b = shared + tok.encode("first question?"), shared + tok.encode("second one!")
    ref_cache, ref_logits = prefill(model, b, 128)
    ar.generate(model, a, 8, tokenizer=tok, prefix_store=store)
    cache, logits = prefill(model, b, 128, store)
    hit = store.last_hit
    assert hit >= len(shared) - 4 and hit % 4 == 0
    assert torch.allclose(logits, ref_logits, atol=1e-5)
    for layer in range(model.config.num_layers):
        assert torch.allclose(cache.k[layer][:, :, : len(b)], ref_cache.k[layer][:, :, : len(b)], atol=1e-5)
    store.pool.check_accounting()


def test_ar_with_prefix_store_is_token_identical(tiny):
    model, tok = tiny
    store = PrefixStore(model, capacity_tokens=256, block_size=2)
    shared = tok.encode("system: be brief. ")
    prompts = [shared + tok.encode(q) for q in ("one", "two", "three", "four", "one")]
    hits = []
    for p in prompts:
        ref = ar.generate(model, p, 16, tokenizer=tok)
        got = ar.generate(model, p, 16, tokenizer=tok, prefix_store=store)
        assert got.token_ids == ref.token_ids
        hits.append(got.extra["prefix_hit_tokens"])
    assert hits[0] == 0 and min(hits[1:]) > 0
    assert hits[-1] >= len(prompts[-1]) - 2  # the repeated prompt hits all but its last block
    store.pool.check_accounting()


def test_tiny_pool_evicts_instead_of_failing(tiny):
    model, tok = tiny
    store = PrefixStore(model, capacity_tokens=64, block_size=4)
    for i in range(12):
        p = tok.encode(f"request number {i} with its own text")
        assert ar.generate(model, p, 8, tokenizer=tok, prefix_store=store).token_ids == \
            ar.generate(model, p, 8, tokenizer=tok).token_ids
    store.pool.check_accounting()
    assert store.metrics.evictions > 0


def test_lookahead_with_prefix_store_is_token_identical(tiny):
    from studylib.decoding import lookahead

    model, tok = tiny
    store = PrefixStore(model, capacity_tokens=512, block_size=4)
    shared = tok.encode("a shared preamble for lookahead requests. ")
    for q in ("alpha beta", "gamma delta", "alpha beta"):
        p = shared + tok.encode(q)
        ref = ar.generate(model, p, 24, tokenizer=tok)
        got = lookahead.generate(model, p, 24, tokenizer=tok, window=3, ngram=3, guesses=3, prefix_store=store)
        assert got.token_ids == ref.token_ids
    assert got.extra["prefix_hit_tokens"] >= len(p) - 4
    store.pool.check_accounting()


def test_speculative_and_prompt_lookup_with_prefix_store(tiny):
    from studylib.decoding import prompt_lookup, speculative

    model, tok = tiny
    shared = tok.encode("the same system prompt, again and again. ")
    for gen, opts in ((prompt_lookup.generate, {"gamma": 4}), (speculative.generate, {"draft": "self:1", "gamma": 3})):
        store = PrefixStore(model, capacity_tokens=512, block_size=4)
        for q in ("one two", "three four", "one two"):
            p = shared + tok.encode(q)
            assert gen(model, p, 20, tokenizer=tok, prefix_store=store, **opts).token_ids == \
                ar.generate(model, p, 20, tokenizer=tok).token_ids
        assert store.last_hit >= len(p) - 4
        store.pool.check_accounting()
