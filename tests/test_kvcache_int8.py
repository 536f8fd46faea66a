"""The 8-bit KV cache (pattern ``int8kv``): storage, bytes, closeness to the fp32 cache, rollback."""

from __future__ import annotations

import pytest
import torch

from studylib.attention import Pattern, make_cache
from studylib.decoding import ar
from studylib.errors import StudylibError
from studylib.kvcache.int8 import Int8KVCache, quantise
from studylib.models import DenseKVCache


def test_quantise_is_round_to_nearest_per_vector():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 16, generator=g)
    x[0, 0, 0] = 0.0  # an all-zero vector keeps scale 0 and decodes to zeros
    q, s = quantise(x)
    assert q.dtype == torch.int8 and s.shape == (2, 3, 7, 1)
    back = q.float() * s
    assert ((back - x).abs() <= s / 2 + 1e-7).all()
    assert torch.equal(back[0, 0, 0], torch.zeros(16))


def test_pattern_and_cache_type():
    assert Pattern.parse("int8kv").spec == "int8kv"
    with pytest.raises(StudylibError):
        Pattern.parse("int8kv:4")


def test_int8_cache_is_close_to_fp32_and_four_times_smaller(tiny):
    model, tok = tiny
    ids = torch.tensor([tok.encode("an eight-bit cache keeps every key, in fewer bytes")])
    n = ids.shape[1]
    dense, int8 = DenseKVCache(model.config, 1, 64), make_cache("int8kv", model.config, 64)
    assert isinstance(int8, Int8KVCache)
    ref = torch.cat([model(ids, dense.begin(n)).logits, model(torch.tensor([[7]]), dense.begin(1)).logits], 1)
    out = torch.cat([model(ids, int8.begin(n)).logits, model(torch.tensor([[7]]), int8.begin(1)).logits], 1)
    assert ((out - ref).abs().max() / ref.abs().max()) < 0.05
    assert not torch.equal(out, ref)  # it is lossy: the test would catch a cache that stayed fp32
    d = model.config.head_dim
    assert int8.nbytes / dense.nbytes == pytest.approx((d + 4) / (4 * d))


def test_truncate_and_keep_move_the_8bit_slots(tiny):
    model, tok = tiny
    ids = torch.tensor([tok.encode("roll back the eight-bit cache")])
    n = ids.shape[1]
    cache = make_cache("int8kv", model.config, 64)
    model(ids, cache.begin(n))
    model(torch.tensor([[5, 6, 7]]), cache.begin(3))
    cache.truncate(n + 1)  # reject 6 and 7: the next step must equal decoding after 5 alone
    got = model(torch.tensor([[9]]), cache.begin(1)).logits
    plain = make_cache("int8kv", model.config, 64)
    model(ids, plain.begin(n))
    model(torch.tensor([[5]]), plain.begin(1))
    assert torch.allclose(got, model(torch.tensor([[9]]), plain.begin(1)).logits, atol=1e-5)
    before = [t[:, :, n + 1].clone() for t in (cache.k[0], cache.k_scale[0], cache.v[0], cache.v_scale[0])]
    cache.keep(n, [n + 1])  # keep only slot n + 1, moved next to the prefix (after a tree verification)
    after = [t[:, :, n] for t in (cache.k[0], cache.k_scale[0], cache.v[0], cache.v_scale[0])]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True)) and cache.length == n + 1


def test_generate_with_int8kv_runs_and_mostly_agrees(tiny):
    model, tok = tiny
    prompt = tok.encode("greedy with an eight-bit cache")
    a = ar.generate(model, prompt, 16).token_ids
    b = ar.generate(model, prompt, 16, attention="int8kv").token_ids
    assert len(b) == len(a) and b[0] == a[0]
