"""Lookahead decoding: the attention-mask builder, the n-gram pool, and exact greedy equality with AR."""

from __future__ import annotations

import itertools

import pytest
import torch

from studylib.decoding import ar, jacobi, lookahead
from studylib.decoding.ngram_pool import NGramPool, PoolConfig
from studylib.decoding.tree_mask import lookahead_layout
from studylib.errors import StudylibError
from studylib.models import DenseKVCache, load_model
from studylib.models.tokenizer import ByteTokenizer
from studylib.sampling import SamplingParams

PROMPTS = ["hello world, hello world, hello", "def f(x):\n    return x + 1\n", "q"]
# (W, N, G): typical, 2-grams, one column, no guesses, N=1 (both branches off), deep window.
CONFIGS = [(5, 4, 5), (3, 2, 3), (1, 3, 2), (4, 5, 0), (1, 1, 0), (3, 1, 4), (7, 3, 7)]


@pytest.fixture(scope="module")
def refs(tiny):
    model, tok = tiny
    return {p: ar.generate(model, tok.encode(p), 30, tokenizer=tok) for p in PROMPTS}


# ---------------------------------------------------------------- mask builder


def _m(rows: list[str]) -> torch.Tensor:
    return torch.tensor([[ch == "1" for ch in r] for r in rows])


def test_mask_hand_worked_two_levels_two_candidates():
    # Slots: 0 c | 1 (l0,j0) 2 (l0,j1) | 3 (l1,j0) 4 (l1,j1) | 5 6 candidate 0 | 7 8 candidate 1
    lay = lookahead_layout(window=2, levels=2, cands=[(40, 41), (50, 51)])
    expected = _m([
        "100000000",  # c
        "110000000",  # (0,0): c, itself
        "111000000",  # (0,1): c, (0,0), itself
        "110100000",  # (1,0): c, (0,0) below it, itself
        "111010000",  # (1,1): c, (0,0) earlier column, (0,1) below it, itself
        "100001000",  # cand 0 token 0
        "100001100",  # cand 0 token 1
        "100000010",  # cand 1 token 0
        "100000011",  # cand 1 token 1
    ])
    assert torch.equal(lay.mask, expected)
    assert lay.offsets.tolist() == [0, 1, 2, 2, 3, 1, 2, 1, 2]
    assert lay.level_index(1) == [3, 4] and lay.cand_index(1) == [7, 8]


def test_mask_hand_worked_one_level_is_plain_causal():
    lay = lookahead_layout(window=3, levels=1, cands=[])
    assert torch.equal(lay.mask, torch.ones(4, 4, dtype=torch.bool).tril())
    assert lay.offsets.tolist() == [0, 1, 2, 3]


def test_mask_hand_worked_three_levels_one_column_uneven_candidates():
    # W=1: the single column is a causal chain c, (0,0), (1,0), (2,0); candidates of length 1 and 3.
    lay = lookahead_layout(window=1, levels=3, cands=[(9,), (7, 8, 9)])
    expected = _m([
        "10000000",
        "11000000",
        "11100000",
        "11110000",
        "10001000",
        "10000100",
        "10000110",
        "10000111",
    ])
    assert torch.equal(lay.mask, expected)
    assert lay.offsets.tolist() == [0, 1, 2, 3, 1, 1, 2, 3]


def test_mask_hand_worked_merged_candidates_form_a_tree():
    # Candidates (5, 6, 7), (5, 6, 8), (5, 9) and (3,) after one level of W=1. Merged, the shared prefixes
    # 5 and 5-6 appear once: slots 2:5  3:6  4:7  5:8  6:9  7:3.
    cands = [(5, 6, 7), (5, 6, 8), (5, 9), (3,)]
    lay = lookahead_layout(window=1, levels=1, cands=cands)
    expected = _m([
        "10000000",  # c
        "11000000",  # lookahead (0,0)
        "10100000",  # 5
        "10110000",  # 5 6
        "10111000",  # 5 6 7
        "10110100",  # 5 6 8
        "10100010",  # 5 9
        "10000001",  # 3
    ])
    assert torch.equal(lay.mask, expected)
    assert lay.offsets.tolist() == [0, 1, 1, 2, 3, 3, 2, 1]
    assert lay.cand_tokens == (5, 6, 7, 8, 9, 3)
    assert [lay.cand_index(i) for i in range(4)] == [[2, 3, 4], [2, 3, 5], [2, 6], [7]]
    flat = lookahead_layout(window=1, levels=1, cands=cands, merge=False)
    assert flat.size == 2 + 9 and flat.cand_index(1) == [5, 6, 7]


@pytest.mark.parametrize("window,levels,cands", [
    (4, 3, [(1, 2, 3), (1, 2, 4), (5,)]), (2, 1, [(7, 7)]), (5, 2, []), (1, 0, [(1, 2, 3, 4), (1, 3)])])
@pytest.mark.parametrize("merge", [True, False])
def test_every_token_sees_one_contiguous_causal_sequence(window, levels, cands, merge):
    # The property the hand-worked masks encode: each token's visible set holds exactly one token per
    # relative position 0..offset, so it reads like a plain causal prefix of its own.
    lay = lookahead_layout(window, levels, cands, merge=merge)
    for q in range(lay.size):
        seen = lay.offsets[lay.mask[q]].sort().values.tolist()
        assert seen == list(range(int(lay.offsets[q]) + 1)), q


def test_masked_forward_matches_plain_causal_forwards(tiny):
    # One combined forward must give each candidate and each lookahead token the same logits as a plain
    # causal forward of the sequence it is meant to see.
    model, tok = tiny
    prefix = tok.encode("a prefix")
    window, levels = 3, 2
    look = [[10, 11, 12], [20, 21, 22]]
    cands = [[30, 31], [30, 33], [40]]  # the first two share their first token: a tree
    lay = lookahead_layout(window, levels, cands)
    c = 7
    tokens = [c, *look[0], *look[1], *lay.cand_tokens]
    cache = DenseKVCache(model.config, 1, 64)
    model(torch.tensor([prefix]), cache.begin(len(prefix)), logits="none")
    pos = (len(prefix) + lay.offsets)[None]
    got = model(torch.tensor([tokens]), cache.begin(lay.size, tree_mask=lay.mask, positions=pos)).logits[0]

    def plain(seq):
        ref_cache = DenseKVCache(model.config, 1, 64)
        return model(torch.tensor([prefix + seq]), ref_cache.begin(len(prefix) + len(seq))).logits[0, -1]

    torch.testing.assert_close(got[lay.cand_index(0)[1]], plain([c, 30, 31]))
    torch.testing.assert_close(got[lay.cand_index(1)[1]], plain([c, 30, 33]))
    torch.testing.assert_close(got[lay.cand_index(2)[0]], plain([c, 40]))
    torch.testing.assert_close(got[lay.level_index(1)[2]], plain([c, 10, 11, 12, 22]))
    torch.testing.assert_close(got[lay.level_index(0)[1]], plain([c, 10, 11]))


# ---------------------------------------------------------------- n-gram pool


def test_pool_per_key_bound_and_lru_eviction():
    pool = NGramPool(PoolConfig(per_key=2, max_keys=10))
    pool.add(1, [2, 3])
    pool.add(1, [4, 5])
    pool.add(1, [2, 3])  # refresh: now the most recent
    pool.add(1, [6, 7])  # evicts (4, 5), the least recently added
    assert pool.lookup(1, 5) == [(6, 7), (2, 3)]
    assert len(pool) == 2 and pool.evicted == 1


def test_pool_key_bound_drops_oldest_key():
    pool = NGramPool(PoolConfig(per_key=3, max_keys=2))
    pool.add(1, [9])
    pool.add(2, [9])
    pool.add(1, [8])  # key 1 becomes the most recently used
    pool.add(3, [9])  # evicts key 2
    assert pool.keys == [1, 3] and pool.lookup(2, 3) == []
    assert pool.lookup(1, 1) == [(8,)]


def test_pool_stays_bounded_and_is_deterministic():
    rng = torch.Generator().manual_seed(0)
    grams = torch.randint(0, 6, (500, 3), generator=rng).tolist()
    pools = []
    for _ in range(2):
        pool = NGramPool(PoolConfig(per_key=3, max_keys=4))
        for g in grams:
            pool.add(g[0], g[1:])
            assert len(pool) <= 12 and len(pool.keys) <= 4
        pools.append(list(pool.items()))
    assert pools[0] == pools[1]


def test_pool_from_sequence_and_limits():
    pool = NGramPool(PoolConfig(per_key=4))
    pool.add_from_sequence([1, 2, 3, 1, 2, 4], n=3)
    assert pool.lookup(1, 4) == [(2, 4), (2, 3)]
    assert pool.lookup(1, 1) == [(2, 4)] and pool.lookup(1, 0) == [] and pool.lookup(99, 3) == []
    pool.add(5, [])  # an empty continuation is no n-gram
    assert 5 not in pool.keys


@pytest.mark.parametrize("kw", [{"per_key": 0}, {"max_keys": 0}])
def test_pool_config_validates(kw):
    with pytest.raises(StudylibError):
        PoolConfig(**kw)


# ---------------------------------------------------------------- decoding


def test_flat_candidates_equal_ar_and_cost_more_tokens(tiny, refs):
    model, tok = tiny
    p = PROMPTS[0]
    kw = dict(tokenizer=tok, window=3, ngram=4, guesses=5, prompt_pool=True)
    tree = lookahead.generate(model, tok.encode(p), 30, merge=True, **kw)
    flat = lookahead.generate(model, tok.encode(p), 30, merge=False, **kw)
    assert tree.token_ids == flat.token_ids == refs[p].token_ids
    assert tree.accepted_lengths == flat.accepted_lengths  # same candidates, same verdicts
    assert sum(tree.extra["forward_tokens"]) < sum(flat.extra["forward_tokens"])


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "W{}N{}G{}".format(*c))
@pytest.mark.parametrize("prompt_pool", [False, True])
def test_greedy_equals_ar(tiny, refs, cfg, prompt_pool):
    model, tok = tiny
    W, N, G = cfg
    for p in PROMPTS:
        ids = tok.encode(p)
        res = lookahead.generate(model, ids, 30, tokenizer=tok, window=W, ngram=N, guesses=G,
                                 prompt_pool=prompt_pool)
        assert res.token_ids == refs[p].token_ids, (p, cfg, prompt_pool)
        assert sum(res.accepted_lengths) == res.new_tokens - 1
        assert res.target_forwards == 1 + res.steps == len(res.extra["forward_tokens"])
        if N == 1 or G == 0:
            assert set(res.accepted_lengths) == {1}


def test_forward_size_matches_the_layout(tiny):
    model, tok = tiny
    res = lookahead.generate(model, tok.encode(PROMPTS[0]), 30, tokenizer=tok, window=4, ngram=3, guesses=2)
    sizes = res.extra["forward_tokens"][1:]
    assert max(sizes) <= lookahead.LookaheadConfig(4, 3, 2).forward_size == 1 + 2 * 4 + 2 * 2
    assert sizes[0] == 1 + 4  # the first step has only level 0 and an empty pool


def test_pool_hits_save_forwards_on_repetitive_text(tiny):
    model, tok = tiny
    res = lookahead.generate(model, tok.encode(PROMPTS[0]), 40, tokenizer=tok, window=5, ngram=4, guesses=5)
    assert res.extra["hit_steps"] > 0 and res.target_forwards < res.new_tokens


@pytest.mark.parametrize("n", [1, 2, 3, 7, 11])
def test_max_new_tokens_clipping(tiny, n):
    model, tok = tiny
    ids = tok.encode(PROMPTS[0])
    ref = ar.generate(model, ids, n, tokenizer=tok)
    res = lookahead.generate(model, ids, n, tokenizer=tok, window=4, ngram=4, guesses=4, prompt_pool=True)
    assert res.token_ids == ref.token_ids and res.new_tokens == n and res.stop_reason == "length"


class _EosTokenizer(ByteTokenizer):
    def __init__(self, eos: int):
        super().__init__()
        self.eos_token_id = eos


def test_eos_inside_an_accepted_candidate(tiny):
    model, tok = tiny
    found = False
    for p, (W, N, G) in itertools.product(PROMPTS, [(5, 4, 5), (7, 3, 7)]):
        ids = tok.encode(p)
        free = lookahead.generate(model, ids, 40, tokenizer=tok, window=W, ngram=N, guesses=G)
        eos, pos = None, 1
        for n in free.accepted_lengths:  # a token first seen strictly inside a multi-token commit
            inner = [free.token_ids[i] for i in range(pos, pos + n - 1) if free.token_ids[i] not in free.token_ids[:i]]
            if inner:
                eos = inner[0]
                break
            pos += n
        if eos is None:
            continue
        found = True
        etok = _EosTokenizer(eos)
        ref = ar.generate(model, ids, 40, tokenizer=etok)
        res = lookahead.generate(model, ids, 40, tokenizer=etok, window=W, ngram=N, guesses=G)
        assert res.token_ids == ref.token_ids and res.token_ids[-1] == eos and res.stop_reason == "eos"
    assert found, "no run produced a multi-token accept to place EOS in"


def test_sampling_is_refused_with_the_alternative_named(tiny):
    model, tok = tiny
    with pytest.raises(StudylibError, match="speculative"):
        lookahead.generate(model, tok.encode("hi"), 5, SamplingParams(temperature=1.0), tokenizer=tok)


@pytest.mark.parametrize("kw", [{"window": 0}, {"ngram": 0}, {"guesses": -1}, {"pool_per_key": 0}])
def test_bad_options_raise(tiny, kw):
    model, tok = tiny
    with pytest.raises(StudylibError):
        lookahead.generate(model, tok.encode("hi"), 5, tokenizer=tok, **kw)


# ---------------------------------------------------------------- the embedded model


@pytest.mark.slow
def test_smollm2_greedy_equality():
    model, tok = load_model("smollm2-135m")
    for text in ["The capital of France is", "def fibonacci(n):\n"]:
        ids = tok(text)["input_ids"]
        ref = ar.generate(model, ids, 32, tokenizer=tok)
        for res in (
            lookahead.generate(model, ids, 32, tokenizer=tok, window=5, ngram=4, guesses=5, prompt_pool=True),
            lookahead.generate(model, ids, 32, tokenizer=tok, window=3, ngram=2, guesses=3),
            jacobi.generate(model, ids, 32, tokenizer=tok, block=6, init="prompt"),
        ):
            assert res.token_ids == ref.token_ids, (text, res.method)


def test_trajectory_cells_show_whole_tokens_and_visible_escapes():
    """Chapter 3's trajectory figure: "reusable" and "bottleneck" stay whole (they were cut to "reusa",
    "bottl"), a newline shows as \\n, and only a token longer than the cell is cut, with an ellipsis."""
    from studylib.experiments.ch03_figures import _cell_token

    assert _cell_token(" reusable") == " reusable" and _cell_token("bottleneck") == "bottleneck"
    assert _cell_token("\n") == "\\n"
    assert _cell_token("internationalisation") == "internati…" and len(_cell_token("x" * 40)) == 10


def test_the_cost_sentence_tells_a_predicted_win_from_a_measured_one():
    """Chapter 3 said 3 of 9 pairs 'beat AR' where only the cost curve predicted it (no measured speed-up
    reached 1)."""
    import pandas as pd

    from studylib.experiments.ch03_figures import explain_cost

    curve = pd.DataFrame({"T": [1, 4, 8], "relative": [1.0, 1.2, 1.6]})
    cost = pd.DataFrame({"compression": [1.5, 1.4, 1.0], "break_even": [1.2, 1.2, 1.2],
                         "speedup": [0.94, 1.1, 0.8], "predicted_speedup": [1.2, 1.1, 0.8]})
    text = explain_cost(cost, curve)
    assert "2 of 3 method/workload pairs" in text and "the cost curve predicts they beat AR" in text
    assert "measured, 1 of them does" in text
