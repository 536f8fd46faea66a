"""Quality measures: ROUGE, the HumanEval subprocess harness, and chunked perplexity."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from studylib.errors import StudylibError
from studylib.eval import humaneval as he
from studylib.eval.perplexity import perplexity
from studylib.models import DenseKVCache, load_model

# --- ROUGE ----------------------------------------------------------------------------------------


def test_rouge_identical_disjoint_and_partial():
    pytest.importorskip("rouge_score")
    from studylib.eval.rouge import rouge, rouge_pairs

    same = rouge(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert same == pytest.approx({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0})
    assert rouge(["red green blue"], ["one two three"]) == pytest.approx({"rouge1": 0, "rouge2": 0, "rougeL": 0})
    part = rouge_pairs(["the cat sat"], ["the cat ran"], stemmer=False)[0]
    assert part["rouge1"] == pytest.approx(2 / 3) and part["rouge2"] == pytest.approx(1 / 2)
    mean = rouge(["the cat sat", "a b c"], ["the cat sat", "x y z"])
    assert mean["rouge1"] == pytest.approx(0.5)
    with pytest.raises(StudylibError, match="pair them up"):
        rouge(["a"], ["a", "b"])


# --- HumanEval harness ----------------------------------------------------------------------------

PROBLEM = {
    "task_id": "toy/add",
    "prompt": 'def add(a, b):\n    """Return the sum of a and b."""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
}


def test_humaneval_correct_and_wrong():
    good = he.check(PROBLEM, "    return a + b\n")
    assert good.passed and good.reason == "passed"
    bad = he.check(PROBLEM, "    return a - b\n")
    assert not bad.passed and "AssertionError" in bad.reason
    crash = he.check(PROBLEM, "    return undefined_name\n")
    assert not crash.passed and "NameError" in crash.reason
    assert he.pass_at_1([good, bad, crash]) == pytest.approx(1 / 3)


def test_humaneval_infinite_loop_times_out():
    res = he.check(PROBLEM, "    while True:\n        pass\n", timeout=1.0)
    assert not res.passed and res.reason.startswith("timed out")


def test_humaneval_early_exit_is_not_a_pass():
    # Exiting with status 0 before check() runs must not count as solving the problem.
    res = he.check(PROBLEM, "    return a + b\nimport sys\nsys.exit(0)\n", trim=False)
    assert not res.passed and "before the tests finished" in res.reason


def test_humaneval_runs_out_of_process():
    # A completion that corrupts its interpreter's state must leave ours untouched.
    res = he.check(PROBLEM, "    return a + b\nimport builtins\nbuiltins.len = None\n", trim=False)
    assert res.passed and len([1, 2]) == 2


def test_trim_completion_stops_at_top_level_code():
    text = "    return a + b\n\n\ndef other():\n    pass\n"
    assert he.trim_completion(text) == "    return a + b\n\n"
    assert he.check(PROBLEM, "    return a + b\n\nprint(add(1, 2))\nassert False\n").passed


def test_humaneval_evaluate_pairs():
    res = he.evaluate([PROBLEM, PROBLEM], ["    return a + b\n", "    return 0\n"], workers=2)
    assert [r.passed for r in res] == [True, False]
    with pytest.raises(StudylibError):
        he.evaluate([PROBLEM], [])


# --- perplexity -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    model, _ = load_model("tiny-random")
    ids = torch.randint(3, 259, (160,), generator=torch.Generator().manual_seed(0))
    return model, ids


def _full_forward_nll(model, ids):
    kv = DenseKVCache(model.config, 1, len(ids), "cpu", torch.float32)
    logits = model.forward(ids[None], kv.begin(len(ids))).logits[0]  # (T, V)
    return F.cross_entropy(logits[:-1], ids[1:], reduction="none")


def test_perplexity_matches_full_forward(tiny):
    model, ids = tiny
    ref = _full_forward_nll(model, ids)
    for chunk in (7, 64, 159, 1000):
        res = perplexity(model, ids, chunk=chunk)
        assert res.tokens == len(ids) - 1
        assert res.ppl == pytest.approx(math.exp(float(ref.mean())), rel=1e-5)
        torch.testing.assert_close(res.token_nll, ref, rtol=1e-4, atol=1e-4)


def test_perplexity_uses_kv_factory(tiny):
    model, ids = tiny
    calls = []

    def windowed(cfg, max_len, device, dtype):
        calls.append((max_len, dtype))
        kv = DenseKVCache(cfg, 1, max_len, device, dtype)
        kv.mask_fn = lambda q, k: (k[:, None, :] <= q[:, :, None]) & (k[:, None, :] > q[:, :, None] - 8)
        return kv

    dense = perplexity(model, ids, chunk=30)
    sparse = perplexity(model, ids, chunk=30, kv_factory=windowed)
    assert calls == [(len(ids), model.dtype)]
    # Within the first 8 tokens the window sees everything; beyond, it must change the predictions.
    torch.testing.assert_close(sparse.token_nll[:7], dense.token_nll[:7], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(sparse.token_nll[40:], dense.token_nll[40:])


def test_perplexity_rejects_bad_input(tiny):
    model, _ = tiny
    with pytest.raises(StudylibError, match="at least 2 tokens"):
        perplexity(model, [5])
    with pytest.raises(StudylibError, match="context window"):
        perplexity(model, torch.ones(model.config.max_position_embeddings + 1, dtype=torch.long))
