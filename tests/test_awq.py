"""AWQ-style Q4_0 (``models.awq``): the scale search, the exactness of the folds, and the error of the
quantised model against plain round-to-nearest Q4_0."""

from __future__ import annotations

import copy

import pytest
import torch

from studylib.models import DenseKVCache, awq, load_model
from studylib.models.weights import _requantised, apply_weights


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    cache = DenseKVCache(model.config, *ids.shape)
    return model(ids, cache.begin(ids.shape[1])).logits


def _mse(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).pow(2).mean().item()


def _with_outlier_channels(model, seed: int = 100):
    """Give each norm 4 salient channels (x10), as real LLMs have: the activations AWQ is built for.
    (The tiny random model's channels are near-uniform: its max/min mean |x| is 1.4-4x.)"""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight[torch.randperm(norm.weight.numel(), generator=g)[:4]] *= 10
    return model


def test_search_includes_rtn_and_never_loses_to_it():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g) / 8
    x = torch.randn(200, 64, generator=g)
    x[:, [5, 30]] *= 20  # two salient input channels
    act = x.abs().mean(0)
    alpha, s, losses = awq.search_scales(x, w, act)
    assert 0.0 in losses and set(losses) == set(awq.ALPHAS)
    assert losses[alpha] == min(losses.values()) <= losses[0.0]
    assert alpha > 0 and losses[alpha] < 0.8 * losses[0.0]  # salient channels: scaling pays
    assert s.shape == (64,) and bool((s > 0).all())
    # alpha 0 is plain RTN: scales of one, the loss of quantising w as is.
    _, s0, l0 = awq.search_scales(x, w, act, alphas=(0.0,))
    assert torch.equal(s0, torch.ones(64)) and l0[0.0] == losses[0.0]


def test_folds_leave_the_function_unchanged():
    """Before rounding, the scaled weights with the folded norms are the dense model."""
    dense, _ = load_model("tiny-random")
    ids = awq.default_calibration(dense.config.vocab_size)
    ref = _logits(dense, ids)
    folded = copy.deepcopy(dense)
    weights, alphas = awq.awq_fold(folded, ids)
    assert set(alphas) == {f"{i}.{k}" for i in range(dense.config.num_layers) for k in ("qkv", "gate_up", "down")}
    changed = False
    for i, layer in enumerate(folded.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        changed |= not torch.equal(attn.qkv_weight, weights[f"{i}.qkv"])
        attn.qkv_weight = weights[f"{i}.qkv"]
        mlp.gate_up_weight = weights[f"{i}.gate_up"]
        mlp.down_proj.weight.data = weights[f"{i}.down"]
        attn.o_proj.weight.data = weights[f"{i}.o"]
    assert changed, "no scale was applied: the fold is not being tested"
    torch.testing.assert_close(_logits(folded, ids), ref, rtol=1e-4, atol=1e-4)
    # The dense model's own (possibly shared) fused weights are untouched.
    torch.testing.assert_close(_logits(dense, ids), ref, rtol=0, atol=0)


def test_awq4_model_runs_with_the_keys_of_the_other_formats():
    dense, _ = load_model("tiny-random")
    keys = set(_requantised(dense, "q4_0", None))
    assert set(awq.awq_quantise(copy.deepcopy(dense), None)) == keys

    model, _ = load_model("tiny-random", weights="awq4")
    assert model.weights_format == "awq4"
    ids = awq.default_calibration(model.config.vocab_size)
    out = _logits(model, ids)
    assert out.shape == (*ids.shape, model.config.vocab_size) and bool(torch.isfinite(out).all())
    # Decode path (few rows: the block kernel) as well as prefill.
    one = torch.tensor([[5]])
    assert bool(torch.isfinite(_logits(model, one)).all())
    # Sanity against a broken fold (which gives errors orders of magnitude larger): on this model,
    # whose channels are near-uniform, AWQ and RTN are within rounding noise of each other.
    rtn, _ = load_model("tiny-random", weights="q4_0")
    ref = _logits(dense, ids)
    assert _mse(out, ref) < 1.25 * _mse(_logits(rtn, ids), ref)


def test_awq_beats_rtn_where_channels_are_salient():
    """On calibration inputs, the model with salient channels: AWQ's error is below RTN Q4_0's."""
    dense, _ = load_model("tiny-random")
    dense = _with_outlier_channels(dense)
    ids = awq.default_calibration(dense.config.vocab_size)
    ref = _logits(dense, ids)
    rtn = apply_weights(copy.deepcopy(dense), "q4_0")
    aw = apply_weights(copy.deepcopy(dense), "awq4", calibration=ids)
    err_rtn, err_awq = _mse(_logits(rtn, ids), ref), _mse(_logits(aw, ids), ref)
    assert err_awq <= err_rtn
    assert err_awq < 0.8 * err_rtn  # measured: about 0.6x
    # and on other text it does not fall apart either
    other = torch.randint(0, dense.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(7))
    ref2 = _logits(dense, other)
    assert _mse(_logits(aw, other), ref2) < _mse(_logits(rtn, other), ref2)


def test_a_reload_reuses_the_chosen_alphas_and_gives_the_same_blocks(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))
    base, _ = load_model("tiny-random")
    _with_outlier_channels(base)
    ids = torch.randint(0, base.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    first = awq.awq_fold(copy.deepcopy(base), ids)
    assert list((tmp_path / "awq").glob("*.json")), "the chosen alphas were not stored"
    calls = []
    real = awq.search_scales
    monkeypatch.setattr(awq, "search_scales", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    second = awq.awq_fold(copy.deepcopy(base), ids)
    assert calls and all(len(grid) == 1 for grid in calls)  # one alpha each: the search was not rerun
    assert first[1] == second[1]
    assert all(torch.equal(first[0][k], second[0][k]) for k in first[0])
    # other calibration ids are another key: the full grid runs again
    calls.clear()
    awq.awq_fold(copy.deepcopy(base), ids.flip(1))
    assert any(len(grid) > 1 for grid in calls)
