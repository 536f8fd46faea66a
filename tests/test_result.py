"""GenerationResult.compression counts the prefill's token but not the prefill forward: n/(n-1) for AR."""

from __future__ import annotations

import pytest

from studylib.decoding import ar
from studylib.decoding.result import GenerationResult


def test_ar_compression_is_n_over_n_minus_1(tiny):
    model, _ = tiny
    res = ar.generate(model, [1, 5, 7, 9], 12)
    n = res.new_tokens
    assert n > 1 and res.target_forwards == n and res.steps == n - 1
    assert res.compression == pytest.approx(n / (n - 1)) and res.compression > 1.0
    assert res.tokens_per_step == 1.0


def test_compression_of_a_single_token_is_one():
    one = GenerationResult([3], "", 1, 1, 0, [], 0.0, 0.0)
    assert one.compression == 1.0
