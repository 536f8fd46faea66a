"""``--act int8``: every ISA path equals the pure-PyTorch reference bit for bit, rows are invariant to
their batch, and the lossless methods stay token-identical to AR under the int8 arithmetic."""

from __future__ import annotations

import pytest
import torch

from studylib.decoding import ar, jacobi, lookahead, prompt_lookup
from studylib.errors import StudylibError
from studylib.models import DenseKVCache, decode_layers, load_model
from studylib.models import int8_linear as I
from studylib.models import quant as Q
from studylib.models.weights import apply_act, check_act

FMTS = sorted(I.CODES)
PATHS = I.available()


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """Each path this CPU runs, forced the way a user forces it (STUDYLIB_INT8_ISA)."""
    monkeypatch.setenv("STUDYLIB_INT8_ISA", request.param)
    assert I.path() == request.param
    return request.param


def _random_blocks(n: int, k: int, fmt: str, seed: int = 0) -> Q.QuantTensor:
    """Arbitrary block bytes (every nibble and int8 value, -128 included) with sane fp16 scales."""
    g = torch.Generator().manual_seed(seed)
    nb, bb = k // Q.BLOCK, Q.FORMATS[fmt][1]
    data = torch.randint(0, 256, (n, nb, bb), dtype=torch.uint8, generator=g)
    scales = (torch.rand(n, nb, 2, generator=g) * 0.1 - 0.05).half().view(torch.uint8).view(n, nb, 4)
    data[..., :4 if fmt == "q4_1" else 2] = scales[..., :4 if fmt == "q4_1" else 2]
    return Q.QuantTensor(data.view(n, nb * bb), fmt, (n, k))


def _awkward_x(m: int, k: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 2, m)[:, None]
    x[0, :32] = 0.0  # an all-zero block: scale 0
    if k >= 64:
        x[-1, 32:64] = torch.arange(32) - 15.5  # amax 16.5 -> values landing on .5 after scaling: ties
    return x


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("m,k,n", [(1, 32, 1), (3, 96, 17), (16, 64, 33), (17, 128, 16), (35, 576, 40),
                                   (70, 160, 50)])
def test_every_path_equals_the_reference_bit_for_bit(path, fmt, m, k, n):
    w = _random_blocks(n, k, fmt, seed=m + n)
    x = _awkward_x(m, k)
    bias = torch.randn(n) if n % 2 else None
    got = I.linear(x, w, bias)
    assert got.shape == (m, n)
    assert torch.equal(got, I.reference(x, w, bias))


@pytest.mark.parametrize("fmt", FMTS)
def test_a_row_has_the_same_bits_in_any_batch(path, fmt):
    """Row invariance: a row alone, at any place in 2, 17 or 40 rows (the AMX tiles take 16-row
    groups, the vector code the rest), gives the same output."""
    w = _random_blocks(48, 256, fmt, seed=3)
    x = _awkward_x(40, 256, seed=4)
    full = I.linear(x, w)
    for i in (0, 15, 16, 31, 39):
        assert torch.equal(I.linear(x[i:i + 1], w), full[i:i + 1])
    assert torch.equal(I.linear(x[14:31], w), full[14:31])


def test_the_rounding_is_the_scheme_and_the_kernels_share_it():
    """Per 32-block: d = amax / 127, q = round-half-even(x / d) in [-127, 127]; the C rounding equals
    the PyTorch one bit for bit, and dequantising q * d stays within half a step of x."""
    import ctypes

    x = _awkward_x(5, 128)
    q, d, sq, sx = I.quantize_activations(x)
    so = I.lib("scalar")
    cq = torch.empty(5, 128, dtype=torch.int8)
    cd, csx = torch.empty(5, 4), torch.empty(5, 4)
    csq = torch.empty(5, 4, dtype=torch.int32)
    so.i8_quantize(x.data_ptr(), 128, 5, 128, cq.data_ptr(), cd.data_ptr(), csq.data_ptr(), csx.data_ptr())
    assert torch.equal(cq, q) and torch.equal(cd, d) and torch.equal(csq, sq) and torch.equal(csx, sx)
    assert ctypes.sizeof(ctypes.c_float) == 4
    assert int(q.abs().max()) == 127 and torch.all(q[0, :32] == 0) and torch.all(d[0, 0] == 0)
    err = (q.float().view(5, 4, 32) * d[..., None] - x.view(5, 4, 32)).abs()
    assert torch.all(err <= d[..., None] / 2 * (1 + 1e-6))
    # A tie rounds to even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
    t = torch.zeros(1, 32)
    t[0, :4] = torch.tensor([0.5, 1.5, 2.5, 127.0])
    assert I.quantize_activations(t)[0][0, :3].tolist() == [0, 2, 2]


def test_int8_is_close_to_the_fp32_product_but_not_equal():
    w = _random_blocks(64, 256, "q4_1")
    x = torch.randn(8, 256)
    exact = x @ w.dequantize().T
    got = I.linear(x, w)
    rel = ((got - exact).norm() / exact.norm()).item()
    assert 0 < rel < 0.02


def test_path_switch_and_bad_values(monkeypatch):
    monkeypatch.setenv("STUDYLIB_INT8_ISA", "avx9000")
    with pytest.raises(StudylibError, match="not one of"):
        I.path()
    monkeypatch.setenv("STUDYLIB_INT8_ISA", "amx")
    monkeypatch.setattr(I, "_cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    with pytest.raises(StudylibError, match="lacks"):
        I.path()
    monkeypatch.setenv("STUDYLIB_INT8_ISA", "auto")
    assert I.path() == "avx2"
    monkeypatch.setattr(I, "_cpu_flags", lambda: frozenset())
    assert I.path() == "scalar" and I.available() == ["scalar"]


def test_act_option_errors():
    assert check_act("int8", "gguf") == "int8"
    with pytest.raises(StudylibError, match="--weights gguf"):
        check_act("int8", "dense")
    with pytest.raises(StudylibError, match="unknown --act"):
        check_act("int4", "q4_1")
    with pytest.raises(StudylibError, match="block-format"):
        load_model("tiny-random", act="int8")


@pytest.mark.parametrize("argv", [
    ["generate", "--model", "tiny-random", "--prompt", "hi", "--act", "int8"],
    ["bench-serve", "--model", "tiny-random", "--act", "int8", "--num-requests", "2"],
    ["generate", "--model", "tiny-random", "--prompt", "hi", "--weights", "q4_1", "--act", "int4"],
    ["bench", "steps", "--model", "tiny-random", "--weights", "q4_1", "--rows", "1,x"],
])
def test_the_cli_refuses_bad_act_and_rows_in_one_line(capsys, argv):
    from studylib.cli import main

    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("studylib: error:") and err.count("\n") == 1, err
    assert ("--act" in err or "--rows" in err) and "Traceback" not in err


@pytest.fixture(scope="module")
def tiny_int8():
    return {fmt: load_model("tiny-random", weights=fmt, act="int8")[0] for fmt in ("q4_1", "q8_0")}


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_fused_and_per_op_paths_compute_one_int8_model(tiny_int8, fmt, monkeypatch):
    """The fused step and the PyTorch layers share the int8 linears; they differ only in the fp32
    order of attention and norms, so they agree to fp32 rounding."""
    model = tiny_int8[fmt]
    assert model.act == "int8"
    prompt = torch.tensor([list(range(3, 40))])
    outs = {}
    for mode in ("auto", "torch"):
        monkeypatch.setenv("STUDYLIB_DECODE_LAYERS", mode)
        cache = DenseKVCache(model.config, 1, 64)
        model(prompt, cache.begin(prompt.shape[1]))
        assert decode_layers.path(model, cache, 3) == ("fused" if mode == "auto" else "torch")
        steps = [model(torch.tensor([[t]]), cache.begin(1)).logits for t in (7, 8, 9)]
        outs[mode] = torch.cat([*steps, model(torch.tensor([[10, 11, 12]]), cache.begin(3)).logits], dim=1)
    assert torch.allclose(outs["auto"], outs["torch"], atol=1e-4, rtol=1e-3)


def test_int8_verification_block_equals_sequential_decodes_bit_for_bit(tiny_int8, path):
    """Row invariance through the whole fused stack under int8, on every path."""
    model = tiny_int8["q4_1"]
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


def test_lossless_methods_stay_identical_to_ar_under_int8(tiny_int8):
    model = tiny_int8["q4_1"]
    prompt = list(b"hello world, hello world, this is a test of the hello world")
    ref = ar.generate(model, prompt, 40).token_ids
    assert prompt_lookup.generate(model, prompt, 40).token_ids == ref
    assert lookahead.generate(model, prompt, 40).token_ids == ref
    assert jacobi.generate(model, prompt, 40).token_ids == ref


def test_apply_act_switches_every_block_linear_and_back():
    model, _ = load_model("tiny-random", weights="q4_1")
    fp = ar.generate(model, list(b"abcabc"), 12).token_ids
    apply_act(model, "int8")
    assert model.act == "int8" and model.lm_head.weight.act == "int8"
    apply_act(model, "fp32")
    assert model.act == "fp32" and ar.generate(model, list(b"abcabc"), 12).token_ids == fp


@pytest.fixture
def amx_everywhere():
    """The amx build with its tiles forced at every row count (``amx_min_rows(1)``), restored afterwards."""
    if "amx" not in PATHS:
        pytest.skip("this CPU has no AMX-INT8")
    old = I.amx_min_rows(1)
    yield
    I.amx_min_rows(old)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("m,k,n", [(1, 32, 16), (2, 96, 17), (4, 64, 48), (8, 160, 33), (16, 256, 64),
                                   (17, 128, 16), (33, 96, 80), (48, 576, 40), (70, 160, 50)])
def test_amx_tiles_at_any_row_count_equal_the_reference_and_vnni(amx_everywhere, fmt, m, k, n):
    """The 2 x 2 tile micro-kernel: one or two row tiles (a partial one padded), one or two weight groups (an
    odd group count leaves one alone), any block count: the same bits as the reference and the VNNI code."""
    w = _random_blocks(n, k, fmt, seed=m + n)
    x = _awkward_x(m, k)
    bias = torch.randn(n) if n % 2 else None
    got = I.linear(x, w, bias, isa="amx")
    assert torch.equal(got, I.reference(x, w, bias))
    assert torch.equal(got, I.linear(x, w, bias, isa="avx512vnni"))


@pytest.mark.parametrize("fmt", FMTS)
def test_every_small_step_on_amx_tiles_equals_the_reference(amx_everywhere, fmt):
    """Steps of 1-16 rows take the one-row-tile kernel (tiles configured to the step's rows, accumulators in
    registers, two groups a pass up to 8 rows): every row count, an odd group count and a partial last group
    (with a bias, so the masked store is seen), and one and two blocks (its pipeline's shortest cases)."""
    for k in (32, 64, 224):
        w = _random_blocks(40, k, fmt, seed=k)
        bias = torch.randn(40)
        for m in range(1, 17):
            x = _awkward_x(m, k, seed=m)
            got = I.linear(x, w, bias, isa="amx")
            assert torch.equal(got, I.reference(x, w, bias)), (k, m)


def test_the_amx_rule_keeps_small_weights_and_few_rows_on_vnni():
    """The default rule (16 rows, 2 Mi weights) gives the same bits whichever side of it a call falls on."""
    if "amx" not in PATHS:
        pytest.skip("this CPU has no AMX-INT8")
    assert I.amx_min_rows() == 16 and I.AMX_MIN_WEIGHTS == 1 << 21
    w = _random_blocks(2048, 1024, "q4_1", seed=5)  # exactly 2 Mi weights: tiles from 16 rows
    for m in (15, 16, 17):
        x = _awkward_x(m, 1024, seed=m)
        assert torch.equal(I.linear(x, w, isa="amx"), I.reference(x, w))


def test_the_amx_row_threshold_is_checked_and_restored(amx_everywhere):
    assert I.amx_min_rows() == 1
    with pytest.raises(StudylibError, match="row count >= 1"):
        I.amx_min_rows(0)
    old = I.amx_min_rows(64)
    assert old == 1 and I.amx_min_rows() == 64
    I.amx_min_rows(1)


@pytest.mark.parametrize("fmt", FMTS)
def test_a_row_has_the_same_bits_in_any_amx_batch(amx_everywhere, fmt):
    w = _random_blocks(48, 256, fmt, seed=3)
    x = _awkward_x(40, 256, seed=4)
    full = I.linear(x, w, isa="amx")
    for i in (0, 15, 16, 31, 39):
        assert torch.equal(I.linear(x[i:i + 1], w, isa="amx"), full[i:i + 1])
    assert torch.equal(I.linear(x[14:31], w, isa="amx"), full[14:31])


def test_provenance_names_the_amx_rule(monkeypatch):
    monkeypatch.setenv("STUDYLIB_INT8_ISA", "scalar")
    assert I.amx_rule() == "not used (path scalar)"
    if "amx" in PATHS:
        monkeypatch.setenv("STUDYLIB_INT8_ISA", "amx")
        assert I.amx_rule() == f"tiles from {I.amx_min_rows()} rows on weights of {1 << 21} entries or more"
        old = I.amx_min_rows(1)
        assert I.amx_rule() == "tiles at every shape"
        I.amx_min_rows(old)
