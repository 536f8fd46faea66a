"""Jacobi decoding: exact greedy equality with AR, stopping, the iteration cap and the trajectory trace."""

from __future__ import annotations

import pytest

from studylib.decoding import ar, jacobi
from studylib.errors import StudylibError
from studylib.models.tokenizer import ByteTokenizer
from studylib.sampling import SamplingParams

PROMPTS = ["hello world, hello world, hello", "def f(x):\n    return x + 1\n", "q"]


@pytest.fixture(scope="module")
def refs(tiny):
    model, tok = tiny
    return {p: ar.generate(model, tok.encode(p), 30, tokenizer=tok) for p in PROMPTS}


@pytest.mark.parametrize("block", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("init", ["pad", "random", "prompt"])
def test_greedy_equals_ar(tiny, refs, block, init):
    model, tok = tiny
    for p in PROMPTS:
        ids = tok.encode(p)
        ref = refs[p]
        res = jacobi.generate(model, ids, 30, tokenizer=tok, block=block, init=init)
        assert res.token_ids == ref.token_ids, (p, block, init)
        assert sum(res.accepted_lengths) == res.new_tokens - 1  # the first token comes from prefill
        assert res.target_forwards == 1 + res.steps
        assert res.extra["forward_tokens"][0] == len(ids)


def test_block_one_is_ar(tiny):
    model, tok = tiny
    res = jacobi.generate(model, tok.encode(PROMPTS[0]), 20, tokenizer=tok, block=1)
    assert res.target_forwards == res.new_tokens and set(res.accepted_lengths) == {1}


def test_parallel_guesses_save_forwards_on_repetitive_text(tiny):
    # The tiny model falls into loops on this prompt; a copied guess then resolves whole blocks.
    model, tok = tiny
    res = jacobi.generate(model, tok.encode(PROMPTS[0]), 40, tokenizer=tok, block=8, init="prompt")
    assert res.target_forwards < res.new_tokens
    assert max(res.accepted_lengths) > 1


def test_max_iters_caps_each_block(tiny):
    model, tok = tiny
    ids = tok.encode(PROMPTS[1])
    ref = ar.generate(model, ids, 25, tokenizer=tok)
    res = jacobi.generate(model, ids, 25, tokenizer=tok, block=6, max_iters=2)
    assert res.token_ids == ref.token_ids
    assert max(res.extra["iters_per_block"]) <= 2


@pytest.mark.parametrize("n", [1, 2, 5, 7, 9])
def test_max_new_tokens_clipping(tiny, n):
    model, tok = tiny
    ids = tok.encode(PROMPTS[0])
    ref = ar.generate(model, ids, n, tokenizer=tok)
    res = jacobi.generate(model, ids, n, tokenizer=tok, block=4, init="prompt")
    assert res.token_ids == ref.token_ids and res.new_tokens == n and res.stop_reason == "length"


class _EosTokenizer(ByteTokenizer):
    def __init__(self, eos: int):
        super().__init__()
        self.eos_token_id = eos


def _mid_accept_eos(res) -> int | None:
    """A token that first appears strictly inside a multi-token accepted chunk of ``res``."""
    pos = 1
    for n in res.accepted_lengths:
        for i in range(pos, pos + n - 1):  # not the chunk's last token
            if res.token_ids[i] not in res.token_ids[:i]:
                return res.token_ids[i]
        pos += n
    return None


def test_eos_inside_an_accepted_chunk(tiny):
    model, tok = tiny
    found = False
    for p in PROMPTS:
        ids = tok.encode(p)
        free = jacobi.generate(model, ids, 40, tokenizer=tok, block=8, init="prompt")
        eos = _mid_accept_eos(free)
        if eos is None:
            continue
        found = True
        etok = _EosTokenizer(eos)
        ref = ar.generate(model, ids, 40, tokenizer=etok)
        res = jacobi.generate(model, ids, 40, tokenizer=etok, block=8, init="prompt")
        assert res.token_ids == ref.token_ids and res.token_ids[-1] == eos
        assert res.stop_reason == "eos" and len(res.token_ids) < free.new_tokens
    assert found, "no prompt produced a multi-token accept to place EOS in"


def test_trace_records_convergence(tiny):
    model, tok = tiny
    ids = tok.encode(PROMPTS[0])
    res = jacobi.generate(model, ids, 24, tokenizer=tok, block=6, init="pad", trace=True)
    blocks = res.extra["trajectory"]
    assert [t for b in blocks for t in b["final"]] == res.token_ids[1:]
    for b in blocks:
        fixed = [s["fixed"] for s in b["states"]]
        assert fixed[0] == 0 and fixed[-1] == len(b["final"]) == b["size"]
        assert all(later > earlier for earlier, later in zip(fixed, fixed[1:], strict=False))
        assert all(len(s["tokens"]) == b["size"] for s in b["states"])
        assert b["states"][-1]["tokens"] == b["final"]


def test_sampling_is_refused_with_the_alternative_named(tiny):
    model, tok = tiny
    with pytest.raises(StudylibError, match="speculative"):
        jacobi.generate(model, tok.encode("hi"), 5, SamplingParams(temperature=0.7), tokenizer=tok)


@pytest.mark.parametrize("kw", [{"block": 0}, {"max_iters": 0}, {"init": "zeros"}])
def test_bad_options_raise(tiny, kw):
    model, tok = tiny
    with pytest.raises(StudylibError):
        jacobi.generate(model, tok.encode("hi"), 5, tokenizer=tok, **kw)
