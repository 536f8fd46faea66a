"""The runtime against HF transformers on the same weights, and the KV cache's contract."""

from __future__ import annotations

import pytest
import torch

from studylib.decoding import ar
from studylib.models import DenseKVCache, load_hf_model, load_model
from studylib.sampling import SamplingParams

PROMPTS = ["Hello world", "The quick brown fox", "1, 2, 3, 4,", "def f(x):\n    return", "Once upon a time"]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def tiny_hf():
    return load_hf_model("tiny-random")


def test_tiny_logits_match_hf(tiny, tiny_hf):
    model, tok = tiny
    ids = torch.tensor([tok.encode("parity check: the runtime equals transformers")])
    cache = DenseKVCache(model.config, 1, 128)
    ours = model(ids, cache.begin(ids.shape[1])).logits
    with torch.no_grad():
        ref = tiny_hf(ids).logits
    assert rel_err(ours, ref) < 1e-4
    # decode steps against the growing cache
    for t in (7, 42, 100):
        nxt = torch.tensor([[t]])
        ours = model(nxt, cache.begin(1)).logits[:, -1]
        ids = torch.cat([ids, nxt], 1)
        with torch.no_grad():
            ref = tiny_hf(ids).logits[:, -1]
        assert rel_err(ours, ref) < 1e-4


def test_tiny_greedy_matches_hf_generate(tiny, tiny_hf):
    model, tok = tiny
    for text in PROMPTS:
        ids = tok.encode(text)
        ours = ar.generate(model, ids, 64, tokenizer=tok)
        with torch.no_grad():
            out = tiny_hf.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False,
                                   eos_token_id=2, pad_token_id=0)
        assert ours.token_ids == out[0, len(ids):].tolist()


def test_chunked_prefill_with_prefix_equals_full_prefill(tiny):
    model, tok = tiny
    ids = torch.tensor([tok.encode("a prefix, then a multi-token chunk after it")])
    full = DenseKVCache(model.config, 1, 64)
    ref = model(ids, full.begin(ids.shape[1])).logits
    part = DenseKVCache(model.config, 1, 64)
    a = model(ids[:, :10], part.begin(10)).logits
    b = model(ids[:, 10:], part.begin(ids.shape[1] - 10)).logits
    assert torch.allclose(torch.cat([a, b], 1), ref, atol=1e-5, rtol=1e-4)
    for layer in range(model.config.num_layers):
        assert torch.allclose(part.k[layer][:, :, : ids.shape[1]], full.k[layer][:, :, : ids.shape[1]], atol=1e-6)


def test_tree_mask_branches_see_only_their_ancestors(tiny):
    """Two one-token branches after a shared prefix, in one forward, equal two separate decodes."""
    model, tok = tiny
    prefix = torch.tensor([tok.encode("shared prefix")])
    n = prefix.shape[1]
    cache = DenseKVCache(model.config, 1, 64)
    model(prefix, cache.begin(n))
    branches = torch.tensor([[50, 60]])
    mask = torch.eye(2, dtype=torch.bool)  # siblings must not see each other
    pos = torch.tensor([[n, n]])
    both = model(branches, cache.begin(2, tree_mask=mask, positions=pos)).logits
    for j, t in enumerate((50, 60)):
        solo = DenseKVCache(model.config, 1, 64)
        model(prefix, solo.begin(n))
        ref = model(torch.tensor([[t]]), solo.begin(1)).logits
        assert torch.allclose(both[:, j], ref[:, 0], atol=1e-5)


def test_truncate_and_keep_restore_a_plain_prefill(tiny):
    model, tok = tiny
    ids = tok.encode("rollback: rejected drafts vanish")
    n = len(ids)
    cache = DenseKVCache(model.config, 1, 64)
    model(torch.tensor([ids]), cache.begin(n))
    model(torch.tensor([[11, 12, 13]]), cache.begin(3))  # three speculative tokens
    cache.truncate(n + 1)  # accept one
    fresh = DenseKVCache(model.config, 1, 64)
    model(torch.tensor([ids + [11]]), fresh.begin(n + 1))
    for layer in range(model.config.num_layers):
        assert torch.allclose(cache.k[layer][:, :, : n + 1], fresh.k[layer][:, :, : n + 1], atol=1e-6)
    # keep(): accept slots n+1 and n+3 of a 3-token tree whose tokens 21 and 23 form a chain
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    pos = torch.tensor([[n + 1, n + 2, n + 2]])
    model(torch.tensor([[21, 22, 23]]), cache.begin(3, tree_mask=mask, positions=pos))
    cache.keep(n + 1, [n + 1, n + 3])
    fresh = DenseKVCache(model.config, 1, 64)
    model(torch.tensor([ids + [11, 21, 23]]), fresh.begin(n + 3))
    assert cache.length == n + 3
    for layer in range(model.config.num_layers):
        assert torch.allclose(cache.v[layer][:, :, : n + 3], fresh.v[layer][:, :, : n + 3], atol=1e-5)


def test_left_padded_batch_equals_single_sequences(tiny):
    model, tok = tiny
    seqs = [tok.encode("short"), tok.encode("a rather longer prompt")]
    width = max(map(len, seqs))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    valid = torch.tensor([[False] * (width - len(s)) + [True] * len(s) for s in seqs])
    cache = DenseKVCache(model.config, 2, 64)
    batch = model(ids, cache.begin(width, valid=valid), logits="last").logits[:, -1]
    step = model(batch.argmax(-1)[:, None], cache.begin(1)).logits[:, -1]
    for b, s in enumerate(seqs):
        solo = DenseKVCache(model.config, 1, 64)
        ref = model(torch.tensor([s]), solo.begin(len(s)), logits="last").logits[:, -1]
        assert torch.allclose(batch[b], ref[0], atol=1e-5)
        ref2 = model(ref.argmax(-1)[:, None], solo.begin(1)).logits[:, -1]
        assert torch.allclose(step[b], ref2[0], atol=1e-5)


def test_sampling_is_seeded_and_reproducible(tiny):
    model, tok = tiny
    ids = tok.encode("sampling")
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=123)
    a = ar.generate(model, ids, 32, p, tokenizer=tok)
    b = ar.generate(model, ids, 32, p, tokenizer=tok)
    c = ar.generate(model, ids, 32, SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=124), tokenizer=tok)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_stops_at_eos_and_max_tokens(tiny):
    model, tok = tiny
    ids = tok.encode("stop")
    free = ar.generate(model, ids, 40, tokenizer=tok)
    assert free.new_tokens == 40 and free.stop_reason == "length"
    assert free.target_forwards == 40 and len(free.accepted_lengths) == free.steps == 39
    # Make the 5th generated token an EOS for this model by declaring it one.
    eos_tok = free.token_ids[4]
    model.config.eos_token_ids.append(eos_tok)
    try:
        stopped = ar.generate(model, ids, 40, tokenizer=tok)
    finally:
        model.config.eos_token_ids.remove(eos_tok)
    first = free.token_ids.index(eos_tok)
    assert stopped.token_ids == free.token_ids[: first + 1] and stopped.stop_reason == "eos"


def test_bfloat16_runs_and_mostly_agrees(tiny):
    model, tok = tiny
    m16, _ = load_model("tiny-random", dtype="bfloat16")
    ids = torch.tensor([tok.encode("dtype check")])
    a = model(ids, DenseKVCache(model.config, 1, 32).begin(ids.shape[1])).logits
    b = m16(ids, DenseKVCache(m16.config, 1, 32, dtype=torch.bfloat16).begin(ids.shape[1])).logits
    assert b.dtype == torch.float32 and rel_err(b, a) < 0.05


@pytest.mark.slow
def test_smollm2_logits_and_generate_match_hf(smollm2):
    model, tok = smollm2
    hf = load_hf_model("smollm2-135m")
    ids = torch.tensor([tok("The capital of France is")["input_ids"]])
    ours = model(ids, DenseKVCache(model.config, 1, 64).begin(ids.shape[1])).logits
    with torch.no_grad():
        ref = hf(ids).logits
    assert rel_err(ours, ref) < 1e-4
    for text in ["The capital of France is", "def fibonacci(n):", "Write a haiku about rain.",
                 "Q: What is 12 times 7?\nA:", "Photosynthesis is"]:
        ids = tok(text)["input_ids"]
        res = ar.generate(model, ids, 64, tokenizer=tok)
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=64, do_sample=False, pad_token_id=2)
        assert res.token_ids == out[0, len(ids):].tolist(), text
