"""``--act bf16``: every ISA path equals the pure-PyTorch reference bit for bit (the order vdpbf16ps
uses), rows are invariant to their batch, and the lossless methods stay token-identical to AR."""

from __future__ import annotations

import pytest
import torch

from studylib.decoding import ar, jacobi, lookahead, prompt_lookup
from studylib.errors import StudylibError
from studylib.models import DenseKVCache, decode_layers, load_model
from studylib.models import bf16_linear as B
from studylib.models import int8_linear as I
from studylib.models.weights import apply_act, check_act
from tests.test_int8_linear import _awkward_x, _random_blocks

FMTS = sorted(B.CODES)
PATHS = B.available()


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """Each path this CPU runs, forced the way a user forces it (STUDYLIB_BF16_ISA)."""
    monkeypatch.setenv("STUDYLIB_BF16_ISA", request.param)
    assert B.path() == request.param
    return request.param


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("m,k,n", [(1, 32, 1), (3, 96, 17), (16, 64, 33), (9, 128, 16), (35, 576, 40),
                                   (70, 160, 50)])
def test_every_path_equals_the_reference_bit_for_bit(path, fmt, m, k, n):
    w = _random_blocks(n, k, fmt, seed=m + n)
    x = _awkward_x(m, k)
    bias = torch.randn(n) if n % 2 else None
    got = B.linear(x, w, bias)
    assert got.shape == (m, n)
    assert torch.equal(got, B.reference(x, w, bias))


def test_the_reference_order_is_not_arbitrary():
    """The pair order matters (the adds round): summing each pair even-first instead gives other bits
    on some outputs, so bit equality above pins the order down."""
    w = _random_blocks(64, 256, "q4_1", seed=9)
    x = _awkward_x(12, 256, seed=5)
    ref = B.reference(x, w)
    xb = B.round_activations(x).reshape(12, 8, 32)
    wq, d, m = B._weights(w)
    acc = torch.zeros(12, 64)
    for b in range(8):
        s = torch.zeros(12, 64)
        for j in range(32):  # plain column order
            s = s + xb[:, b, j, None] * wq[None, :, b, j]
        acc = acc + d[None, :, b] * s
        v = xb[:, b]
        for h in (16, 8, 4, 2, 1):
            v = v[:, :h] + v[:, h:2 * h]
        acc = acc + m[None, :, b] * v[:, 0, None]
    assert torch.allclose(acc, ref, rtol=1e-5, atol=1e-5) and not torch.equal(acc, ref)


@pytest.mark.parametrize("fmt", FMTS)
def test_a_row_has_the_same_bits_in_any_batch(path, fmt):
    w = _random_blocks(48, 256, fmt, seed=3)
    x = _awkward_x(40, 256, seed=4)
    full = B.linear(x, w)
    for i in (0, 7, 8, 31, 39):
        assert torch.equal(B.linear(x[i:i + 1], w), full[i:i + 1])
    assert torch.equal(B.linear(x[5:30], w), full[5:30])


def test_the_rounding_is_bf16_nearest_even_with_denormals_flushed_and_the_kernels_share_it():
    x = _awkward_x(5, 128)
    x[1, 3] = 1e-39  # denormal -> +0
    x[1, 4] = -1e-39  # -> -0
    x[2, 5] = 1.0 + 2.0 ** -8  # a tie: rounds to even (1.0)
    x[2, 6] = 1.0 + 3 * 2.0 ** -8  # a tie: rounds to even (1 + 2^-6)
    xb = B.round_activations(x)
    normal = x.abs() >= torch.finfo(torch.float32).tiny
    assert torch.equal(xb[normal], x[normal].to(torch.bfloat16).float())  # torch's cast: nearest, ties even
    assert xb[1, 3].item() == 0.0 and str(xb[1, 4].item()) == "-0.0"
    assert xb[2, 5].item() == 1.0 and xb[2, 6].item() == 1.0 + 2.0 ** -6
    for isa in PATHS:
        cb, csx = torch.empty(5, 128, dtype=torch.int16), torch.empty(5, 4)
        B.lib(isa).bf_round(x.data_ptr(), 128, 5, 128, cb.data_ptr(), csx.data_ptr())
        assert torch.equal(cb.view(torch.bfloat16).float().view(torch.int32), xb.view(torch.int32)), isa
        v = xb.view(5, 4, 32)
        for h in (16, 8, 4, 2, 1):
            v = v[..., :h] + v[..., h:2 * h]
        assert torch.equal(csx, v[..., 0]), isa


def test_denormal_inputs_count_as_zero(path):
    w = _random_blocks(32, 64, "q4_1", seed=2)
    x = torch.randn(3, 64)
    tiny = x.clone()
    tiny[:, ::3] = 1e-40
    zero = x.clone()
    zero[:, ::3] = 0.0
    assert torch.equal(B.linear(tiny, w), B.linear(zero, w))


def test_bf16_is_closer_to_the_fp32_product_than_int8():
    w = _random_blocks(64, 256, "q4_1")
    x = torch.randn(8, 256)
    exact = x @ w.dequantize().T
    rel = {name: ((f(x, w) - exact).norm() / exact.norm()).item() for name, f in (("bf16", B.linear), ("int8", I.linear))}
    assert 0 < rel["bf16"] < rel["int8"] < 0.02


def test_path_switch_and_bad_values(monkeypatch):
    monkeypatch.setenv("STUDYLIB_BF16_ISA", "amx")
    with pytest.raises(StudylibError, match="not one of"):
        B.path()
    monkeypatch.setenv("STUDYLIB_BF16_ISA", "avx512bf16")
    monkeypatch.setattr(B, "_cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "avx512f"}))
    with pytest.raises(StudylibError, match="lacks"):
        B.path()
    monkeypatch.setenv("STUDYLIB_BF16_ISA", "auto")
    assert B.path() == "avx2"
    monkeypatch.setattr(B, "_cpu_flags", lambda: frozenset())
    assert B.path() == "scalar" and B.available() == ["scalar"]


def test_act_option_errors():
    assert check_act("bf16", "gguf") == "bf16"
    with pytest.raises(StudylibError, match="--weights gguf"):
        check_act("bf16", "dense")


@pytest.fixture(scope="module")
def tiny_bf16():
    return {fmt: load_model("tiny-random", weights=fmt, act="bf16")[0] for fmt in ("q4_0", "q8_0")}


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
def test_fused_and_per_op_paths_compute_one_bf16_model(tiny_bf16, fmt, monkeypatch):
    """The fused step and the PyTorch layers share the bf16 linears and differ only in the fp32 order
    of attention and norms; a last-bit difference can move a bf16 rounding of x, so the two agree far
    more closely than the bf16 model agrees with the fp32 one, though not always to fp32 rounding."""
    model = tiny_bf16[fmt]
    assert model.act == "bf16"
    prompt = torch.tensor([list(range(3, 40))])
    outs = {}
    for mode in ("auto", "torch"):
        monkeypatch.setenv("STUDYLIB_DECODE_LAYERS", mode)
        cache = DenseKVCache(model.config, 1, 64)
        model(prompt, cache.begin(prompt.shape[1]))
        assert decode_layers.path(model, cache, 3) == ("fused" if mode == "auto" else "torch")
        steps = [model(torch.tensor([[t]]), cache.begin(1)).logits for t in (7, 8, 9)]
        outs[mode] = torch.cat([*steps, model(torch.tensor([[10, 11, 12]]), cache.begin(3)).logits], dim=1)
    monkeypatch.setenv("STUDYLIB_DECODE_LAYERS", "auto")
    fp32, _ = load_model("tiny-random", weights=fmt)
    cache = DenseKVCache(fp32.config, 1, 64)
    fp32(prompt, cache.begin(prompt.shape[1]))
    steps = [fp32(torch.tensor([[t]]), cache.begin(1)).logits for t in (7, 8, 9)]
    exact = torch.cat([*steps, fp32(torch.tensor([[10, 11, 12]]), cache.begin(3)).logits], dim=1)
    paths = (outs["auto"] - outs["torch"]).abs().mean().item()
    arith = (outs["auto"] - exact).abs().mean().item()
    assert paths < 0.1 * arith and arith > 0


def test_bf16_verification_block_equals_sequential_decodes_bit_for_bit(tiny_bf16, path):
    model = tiny_bf16["q4_0"]
    prefix = torch.tensor([list(range(5, 25))])
    n = prefix.shape[1]
    cache = DenseKVCache(model.config, 1, 64)
    model(prefix, cache.begin(n))
    block = model(torch.tensor([[50, 60, 70]]), cache.begin(3)).logits
    solo = DenseKVCache(model.config, 1, 64)
    model(prefix, solo.begin(n))
    for j, t in enumerate((50, 60, 70)):
        assert decode_layers.path(model, solo, 1) == "fused"
        assert torch.equal(block[:, j], model(torch.tensor([[t]]), solo.begin(1)).logits[:, 0])


def test_lossless_methods_stay_identical_to_ar_under_bf16(tiny_bf16):
    model = tiny_bf16["q4_0"]
    prompt = list(b"hello world, hello world, this is a test of the hello world")
    ref = ar.generate(model, prompt, 40).token_ids
    assert prompt_lookup.generate(model, prompt, 40).token_ids == ref
    assert lookahead.generate(model, prompt, 40).token_ids == ref
    assert jacobi.generate(model, prompt, 40).token_ids == ref


def test_the_three_arithmetics_are_three_models():
    """fp32, int8 and bf16 activations give different logits from one set of weights, and switching
    back restores the fp32 model exactly."""
    model, _ = load_model("tiny-random", weights="q4_1")
    ids = torch.tensor([list(range(3, 30))])
    logits = {}
    for act in ("fp32", "int8", "bf16", "fp32"):
        apply_act(model, act)
        cache = DenseKVCache(model.config, 1, 64)
        out = model(ids, cache.begin(ids.shape[1])).logits
        if act in logits:
            assert torch.equal(out, logits[act])
        logits[act] = out
    assert not torch.equal(logits["bf16"], logits["fp32"]) and not torch.equal(logits["bf16"], logits["int8"])


def test_a_nan_stays_a_nan_and_a_missing_path_is_refused(path, monkeypatch):
    x = torch.randn(2, 64)
    x[0, 5] = float("nan")
    assert torch.isnan(B.round_activations(x)[0, 5]) and not torch.isnan(B.round_activations(x)[1]).any()
    w = _random_blocks(16, 64, "q4_1", seed=1)
    y = B.linear(x, w)
    assert torch.isnan(y[0]).all() and not torch.isnan(y[1]).any()
    monkeypatch.setattr(B, "_cpu_flags", lambda: frozenset())
    with pytest.raises(StudylibError, match="cannot run"):
        B.lib("avx2")
    with pytest.raises(StudylibError, match="no bf16_linear path"):
        B.lib("avx9000")
