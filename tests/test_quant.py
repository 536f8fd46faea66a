"""Block-format weights (Q4_0, Q4_1, Q8_0): kernels against the pure-PyTorch reference, row
invariance, both ISA builds, block models on the tiny model and the embedded GGUF."""

from __future__ import annotations

import pytest
import torch

from studylib.decoding import ar
from studylib.errors import StudylibError
from studylib.models import DenseKVCache, decode_layers, load_model
from studylib.models import quant as Q
from studylib.models.weights import apply_weights, check_weights, weight_bytes

FMTS = sorted(Q.FORMATS)


def _isas():
    flags = Q._cpu_flags()
    return [name for name in ("avx512", "avx2") if Q._NEEDS[name] <= flags]


@pytest.fixture(params=_isas() or ["torch"])
def isa(request, monkeypatch):
    """Run the test under each kernel build this CPU can execute (STUDYLIB_QUANT_ISA forces one)."""
    if request.param != "torch":
        monkeypatch.setenv("STUDYLIB_QUANT_ISA", request.param)
        assert Q.isa() == request.param
    return request.param


def _random_blocks(n: int, k: int, fmt: str, seed: int = 0) -> Q.QuantTensor:
    """Arbitrary block bytes with sane fp16 scales: the kernel must read any content right."""
    g = torch.Generator().manual_seed(seed)
    nb, bb = k // Q.BLOCK, Q.FORMATS[fmt][1]
    data = torch.randint(0, 256, (n, nb, bb), dtype=torch.uint8, generator=g)
    scales = (torch.rand(n, nb, 2, generator=g) * 0.1 - 0.05).half().view(torch.uint8).view(n, nb, 4)
    data[..., :4 if fmt == "q4_1" else 2] = scales[..., :4 if fmt == "q4_1" else 2]
    return Q.QuantTensor(data.view(n, nb * bb), fmt, (n, k))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", [(1, 32), (7, 64), (13, 96), (33, 160)])
def test_kernel_dequant_equals_reference(isa, fmt, n, k):
    qt = _random_blocks(n, k, fmt)
    ref = Q.dequantize_ref(qt)
    assert torch.equal(qt.dequantize(), ref)
    ids = torch.tensor([[n - 1, 0], [n // 2, n - 1]])
    assert torch.equal(qt.rows(ids), ref[ids])


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", [(1, 32), (5, 64), (9, 96), (37, 192), (130, 576)])
def test_kernel_linear_matches_reference_and_is_row_invariant(isa, fmt, n, k):
    qt = _random_blocks(n, k, fmt, seed=n)
    g = torch.Generator().manual_seed(k)
    x = torch.randn(11, k, generator=g)
    bias = torch.randn(n, generator=g)
    ref = (x.double() @ Q.dequantize_ref(qt).double().T + bias.double())
    if isa == "torch":
        pytest.skip("no kernel build on this CPU")
    y = Q.kernel_linear(x, qt, bias)
    assert ((y.double() - ref).abs().max() / ref.abs().max()) < 1e-5
    for m in (1, 2, 3, 4, 5, 11):  # a row's bits do not depend on what it is batched with
        assert torch.equal(Q.kernel_linear(x[:m], qt, bias), y[:m])
    assert torch.equal(Q.kernel_linear(x[6:7], qt, bias)[0], y[6])


@pytest.mark.parametrize("fmt", FMTS)
def test_quantize_rounds_to_the_nearest_level(fmt):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(40, 96, generator=g) * 0.05
    qt = Q.quantize(w, fmt)
    err = (Q.dequantize_ref(qt) - w).abs().view(40, 3, 32)
    blocks = qt.data.view(40, 3, qt.block_bytes)
    d = blocks[..., :2].contiguous().view(torch.float16).float().abs()
    # Round to nearest: within half a step (plus fp16 rounding of the scale itself); Q4_0 maps the
    # largest magnitude to -8, so the opposite extreme clamps at +7: up to a full step there.
    half = 1.0 if fmt == "q4_0" else 0.5
    assert (err <= d * half + w.abs().view(40, 3, 32).amax(-1, keepdim=True) * 2e-3 + 1e-7).all()
    # Requantising a dequantised weight is a fixed point (the levels are exactly representable).
    again = Q.quantize(Q.dequantize_ref(qt), fmt)
    assert torch.allclose(Q.dequantize_ref(again), Q.dequantize_ref(qt), atol=1e-6)


def test_isa_switch_and_bad_values(monkeypatch):
    monkeypatch.setenv("STUDYLIB_QUANT_ISA", "sse9")
    with pytest.raises(StudylibError, match="STUDYLIB_QUANT_ISA"):
        Q.isa()
    monkeypatch.setenv("STUDYLIB_QUANT_ISA", "avx512")
    monkeypatch.setattr(Q, "_cpu_flags", lambda: {"avx2", "fma", "f16c"})
    with pytest.raises(StudylibError, match="lacks"):
        Q.isa()
    monkeypatch.setenv("STUDYLIB_QUANT_ISA", "auto")
    assert Q.isa() == "avx2"
    monkeypatch.setattr(Q, "_cpu_flags", lambda: set())
    assert Q.isa() == "torch"
    x, qt = torch.randn(2, 64), _random_blocks(3, 64, "q4_1")
    assert torch.allclose(Q.linear(x, qt), x @ Q.dequantize_ref(qt).T, atol=1e-5)  # the reference path


def test_weights_option_errors():
    with pytest.raises(StudylibError, match="unknown --weights"):
        check_weights("int3")
    with pytest.raises(StudylibError, match="GGUF"):
        check_weights("gguf", "tiny-random")
    with pytest.raises(StudylibError, match="CPU only"):
        check_weights("q8_0", "tiny-random", "cuda")
    with pytest.raises(StudylibError, match="fp32"):
        load_model("tiny-random", weights="q8_0", dtype="bfloat16")


@pytest.fixture(scope="module")
def tiny_q():
    return {fmt: load_model("tiny-random", weights=fmt)[0] for fmt in FMTS}


def _dequantised_copy(qm):
    """A dense tiny model holding exactly the block model's dequantised weights."""
    dense, _ = load_model("tiny-random")
    with torch.no_grad():
        for d, q in zip(dense.model.layers, qm.model.layers, strict=True):
            d.self_attn.qkv_weight.copy_(q.self_attn.qkv_weight.dequantize())
            d.self_attn.o_proj.weight.copy_(q.self_attn.o_proj.weight.dequantize())
            d.mlp.gate_up_weight.copy_(q.mlp.gate_up_weight.dequantize())
            d.mlp.down_proj.weight.copy_(q.mlp.down_proj.weight.dequantize())
        dense.model.embed_tokens.weight.copy_(qm.model.embed_tokens.weight.dequantize())
        dense.lm_head.weight.copy_(qm.lm_head.weight.dequantize())
    return dense


@pytest.mark.parametrize("fmt", FMTS)
def test_block_model_computes_its_dequantised_weights(tiny, tiny_q, fmt):
    dense, tok = tiny
    qm = tiny_q[fmt]
    ids = torch.tensor([tok.encode("a block model of the tiny random llama")])
    n = ids.shape[1]
    ref = _dequantised_copy(qm)(ids, DenseKVCache(dense.config, 1, 64).begin(n)).logits
    out = qm(ids, DenseKVCache(qm.config, 1, 64).begin(n)).logits
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-4)
    orig = dense(ids, DenseKVCache(dense.config, 1, 64).begin(n)).logits
    if fmt == "q8_0":  # 8-bit stays close to the original weights; 4-bit of random weights need not
        assert ((out - orig).abs().max() / orig.abs().max()) < 0.05
    assert weight_bytes(qm) < weight_bytes(dense) * (0.3 if fmt == "q8_0" else 0.2)
    assert qm.weights_format == fmt and qm.dtype == torch.float32


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_fused_layers_equal_the_per_op_path(tiny_q, fmt, monkeypatch):
    """decode_layers.c and the PyTorch layers compute the same model (to fp32 rounding)."""
    model = tiny_q[fmt]
    prompt = torch.tensor([list(range(3, 40))])
    outs = {}
    for mode in ("auto", "torch"):
        monkeypatch.setenv("STUDYLIB_DECODE_LAYERS", mode)
        cache = DenseKVCache(model.config, 1, 64)
        model(prompt, cache.begin(prompt.shape[1]))
        assert decode_layers.path(model, cache, 1) == ("fused" if mode == "auto" else "torch")
        steps = [model(torch.tensor([[t]]), cache.begin(1)).logits for t in (7, 8, 9)]
        branch = model(torch.tensor([[10, 11, 12]]), cache.begin(3)).logits
        outs[mode] = torch.cat([*steps, branch], dim=1)
    assert torch.allclose(outs["auto"], outs["torch"], atol=1e-5, rtol=1e-4)


def test_fused_tree_step_equals_sequential_decodes_bit_for_bit(tiny_q):
    """Row invariance through the whole stack: two sibling branches verified in one step have the
    bits of the same tokens decoded alone (what keeps speculative verification exactly lossless)."""
    model = tiny_q["q4_1"]
    prefix = torch.tensor([list(range(5, 25))])
    n = prefix.shape[1]
    cache = DenseKVCache(model.config, 1, 64)
    model(prefix, cache.begin(n))
    both = model(torch.tensor([[50, 60]]), cache.begin(2, tree_mask=torch.eye(2, dtype=torch.bool),
                                                        positions=torch.tensor([[n, n]]))).logits
    for j, t in enumerate((50, 60)):
        solo = DenseKVCache(model.config, 1, 64)
        model(prefix, solo.begin(n))
        assert decode_layers.path(model, solo, 1) == "fused"
        assert torch.equal(both[:, j], model(torch.tensor([[t]]), solo.begin(1)).logits[:, 0])


def test_speculative_on_a_block_model_equals_its_ar(tiny_q):
    from studylib.decoding import speculative
    from studylib.decoding.drafts import SelfDraft

    model = tiny_q["q4_1"]
    prompt = list(b"hello world, hello world, this is a test of the")
    ref = ar.generate(model, prompt, 40).token_ids
    got = speculative.generate(model, prompt, 40, draft=SelfDraft([1]), gamma=4).token_ids
    assert got == ref


def test_gguf_is_the_dense_model_in_its_own_blocks(smollm2):
    """The GGUF blocks dequantise to exactly the converted fp32 weights, so --weights gguf computes
    the dense model's logits (to fp32 summation order) while reading 5.6x fewer bytes."""
    dense, tok = smollm2
    g, _ = load_model("smollm2-135m", weights="gguf")
    emb = g.model.embed_tokens.weight
    assert emb.fmt == "q8_0" and torch.equal(emb.dequantize(), dense.model.embed_tokens.weight)
    layer, glayer = dense.model.layers[3], g.model.layers[3]
    assert torch.equal(glayer.self_attn.qkv_weight.dequantize(), layer.self_attn.qkv_weight)
    assert torch.equal(glayer.mlp.down_proj.weight.dequantize(), layer.mlp.down_proj.weight)
    assert weight_bytes(dense) / weight_bytes(g) > 5.5
    ids = torch.tensor([tok.encode("The capital of France is Paris, and the capital of Italy is")])
    n = ids.shape[1]
    cd, cg = DenseKVCache(dense.config, 1, 64), DenseKVCache(g.config, 1, 64)
    ref = torch.cat([dense(ids, cd.begin(n)).logits, dense(torch.tensor([[42]]), cd.begin(1)).logits], 1)
    out = torch.cat([g(ids, cg.begin(n)).logits, g(torch.tensor([[42]]), cg.begin(1)).logits], 1)
    assert ((out - ref).abs().max() / ref.abs().max()) < 1e-4
    assert ar.generate(g, ids[0].tolist(), 24).token_ids == ar.generate(dense, ids[0].tolist(), 24).token_ids


def test_apply_weights_rejects_bf16(tiny):
    model, _ = load_model("tiny-random", dtype="bfloat16")
    with pytest.raises(StudylibError, match="fp32"):
        apply_weights(model, "q8_0")


def test_dense_fp32_can_take_the_fused_path_and_stays_exact_across_rows(tiny):
    """Chapter 8's reference: plain fp32 weights through decode_layers.c (format F32) compute the same
    model as the per-op path, and a tree step equals sequential decodes bit for bit."""
    model, _ = load_model("tiny-random")
    prefix = torch.tensor([list(range(5, 25))])
    n = prefix.shape[1]
    ref_cache = DenseKVCache(model.config, 1, 64)
    model(prefix, ref_cache.begin(n))
    ref = model(torch.tensor([[50]]), ref_cache.begin(1)).logits
    model.fused_decode = True
    cache = DenseKVCache(model.config, 1, 64)
    model(prefix, cache.begin(n))
    assert decode_layers.path(model, cache, 2) == "fused"
    both = model(torch.tensor([[50, 60]]), cache.begin(2, tree_mask=torch.eye(2, dtype=torch.bool),
                                                        positions=torch.tensor([[n, n]]))).logits
    assert torch.allclose(both[:, 0], ref[:, 0], atol=1e-5)
    solo = DenseKVCache(model.config, 1, 64)
    model(prefix, solo.begin(n))
    assert torch.equal(both[:, 1], model(torch.tensor([[60]]), solo.begin(1)).logits[:, 0])


def test_fused_step_rejects_a_step_that_does_not_fit_the_cache(tiny_q):
    model = tiny_q["q8_0"]
    cache = DenseKVCache(model.config, 1, 64)
    model(torch.tensor([[3, 4, 5]]), cache.begin(3))
    kv = cache.begin(1)
    x = torch.zeros(2, 1, model.config.hidden_size)  # two rows against a batch-1 cache
    cos = sin = torch.ones(2, 1, 1, model.config.head_dim)
    with pytest.raises(StudylibError, match="does not fit"):
        decode_layers.run(model, x, cos, sin, kv)


def test_out_of_range_ids_get_one_line(tiny_q):
    with pytest.raises(StudylibError, match="out of range"):
        tiny_q["q4_0"](torch.tensor([[1, 10_000]]), DenseKVCache(tiny_q["q4_0"].config, 1, 8).begin(2))


def test_requantising_a_block_model_is_refused(tiny_q):
    with pytest.raises(StudylibError, match="already"):
        apply_weights(tiny_q["q4_1"], "q8_0")


def test_bf16_prefill_option_changes_only_long_steps(tiny_q):
    with pytest.raises(StudylibError, match="bf16prefill"):
        check_weights("dense+bf16prefill")
    with pytest.raises(StudylibError, match="unknown --weights"):
        check_weights("q4_1+fast")
    fast, _ = load_model("tiny-random", weights="q4_1+bf16prefill")
    exact = tiny_q["q4_1"]
    assert fast.weights_format == "q4_1+bf16prefill"
    long = torch.tensor([[(7 * i) % 250 + 3 for i in range(80)]])  # > KERNEL_MAX_ROWS: the GEMM path
    a = exact(long, DenseKVCache(exact.config, 1, 96).begin(80)).logits
    b = fast(long, DenseKVCache(fast.config, 1, 96).begin(80)).logits
    assert not torch.equal(a, b) and ((a - b).abs().max() / a.abs().max()) < 0.05
    short = long[:, :10]  # within the kernel's rows: the same fp32 arithmetic
    assert torch.equal(exact(short, DenseKVCache(exact.config, 1, 16).begin(10)).logits,
                       fast(short, DenseKVCache(fast.config, 1, 16).begin(10)).logits)


def test_the_fused_step_hands_back_intermediate_layers_and_stays_fused(monkeypatch):
    """EAGLE-3 reads low/middle/high layer outputs on every verification: the fused C step returns them
    (the per-op path's values, to fp32 order), and asking for them changes neither the path nor the logits."""
    from studylib.models import DenseKVCache, decode_layers, load_model

    model, _ = load_model("tiny-random", weights="q4_1", act="int8")
    ids = torch.tensor([list(range(5, 30))])
    got = {}
    for mode in ("auto", "torch"):
        monkeypatch.setenv("STUDYLIB_DECODE_LAYERS", mode)
        cache = DenseKVCache(model.config, 1, 64)
        assert decode_layers.path(model, cache, ids.shape[1]) == ("fused" if mode == "auto" else "torch")
        plain = model(ids, cache.begin(ids.shape[1])).logits
        cache = DenseKVCache(model.config, 1, 64)
        out = model(ids, cache.begin(ids.shape[1]), hidden_layers=(0, 1, -1))
        assert torch.equal(out.logits, plain) and set(out.hidden) == {0, 1, -1}
        got[mode] = out.hidden
    for i in (0, 1, -1):
        assert torch.allclose(got["auto"][i].float(), got["torch"][i].float(), atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("act", ["fp32", "int8"])
def test_a_self_speculative_draft_skips_its_layers_on_the_fused_path(monkeypatch, act):
    """A draft that bypasses layers runs in the one C call too (per-op, chapter 2's self:4 draft cost 2.2
    target steps): the same logits as the per-op path with those layers skipped, the skipped layers' cache
    untouched, and different logits from the full model (the skip is not ignored)."""
    from studylib.models import DenseKVCache, load_model

    model, _ = load_model("tiny-random", weights="q4_1", act=act)
    ids = torch.tensor([list(range(5, 30))])
    skip = (1,)
    got = {}
    for mode in ("auto", "torch"):
        monkeypatch.setenv("STUDYLIB_DECODE_LAYERS", mode)
        cache = DenseKVCache(model.config, 1, 64)
        model(ids, cache.begin(ids.shape[1]))
        before = cache.k[1].clone()
        calls = []
        real = decode_layers.run
        monkeypatch.setattr(decode_layers, "run", lambda *a, calls=calls, real=real, **k: calls.append(k) or real(*a, **k))
        steps = [model(torch.tensor([[t]]), cache.begin(1), skip_layers=skip).logits for t in (7, 8, 9)]
        monkeypatch.setattr(decode_layers, "run", real)
        assert len(calls) == (3 if mode == "auto" else 0)
        assert torch.equal(cache.k[1], before)  # a skipped layer writes no keys
        got[mode] = torch.cat(steps, dim=1)
        full = DenseKVCache(model.config, 1, 64)
        model(ids, full.begin(ids.shape[1]))
        assert not torch.allclose(model(torch.tensor([[7]]), full.begin(1)).logits, steps[0])
    assert torch.allclose(got["auto"], got["torch"], atol=1e-4, rtol=1e-3)
    with pytest.raises(StudylibError, match="skip_layers and hidden_layers"):
        cache = DenseKVCache(model.config, 1, 64)
        x = model.model.embed_tokens(ids)
        decode_layers.run(model, x, x, x, cache.begin(ids.shape[1]), (0,), {}, skip_layers=(1,))


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (8, 2), (9, 1), (4, 4)])
@pytest.mark.parametrize("act", ["fp32", "int8"])
def test_grouped_head_attention_keeps_every_row_bits_of_its_solo_decode(heads, kv_heads, act):
    """decode_layers.c attends to a KV head with up to four of its query heads at once (64-wide heads keep their
    accumulators in registers), and a one-row step goes head by head. Rows of
    a masked multi-row step must still carry the bits of the same tokens decoded alone, for 3 and 4 heads a KV
    head (one chunk), 9 (chunks of 4, 4 and 1) and 1, with the keys a row sees not a multiple of the lanes."""
    from dataclasses import replace

    from studylib.models import _random_model
    from studylib.models.presets import tiny_config
    from studylib.models.weights import apply_act

    cfg = replace(tiny_config(), hidden_size=heads * 64, num_heads=heads, num_kv_heads=kv_heads, head_dim=64,
                  name=f"tiny-random-gqa{heads}x{kv_heads}")
    model = apply_act(apply_weights(_random_model(cfg, torch.device("cpu"), torch.float32, 7), "q4_1"), act)
    prefix = torch.tensor([list(range(5, 42))])
    n = prefix.shape[1]
    branch = [50, 60, 70, 80, 90]
    cache = DenseKVCache(model.config, 1, 64)
    model(prefix, cache.begin(n))
    step = model(torch.tensor([branch]), cache.begin(len(branch), tree_mask=torch.eye(len(branch), dtype=torch.bool),
                                                     positions=torch.tensor([[n] * len(branch)]))).logits
    for j, t in enumerate(branch):
        solo = DenseKVCache(model.config, 1, 64)
        model(prefix, solo.begin(n))
        assert decode_layers.path(model, solo, 1) == "fused"
        assert torch.equal(step[:, j], model(torch.tensor([[t]]), solo.begin(1)).logits[:, 0]), (j, t)
