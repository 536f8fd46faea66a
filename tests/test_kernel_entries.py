"""Every C linear entry, driven with random shapes, row counts, strides, dtypes and biases (hypothesis):
a good call equals its pure-PyTorch reference (bit for bit where the kernel is exact, to rounding where it
sums in another order), and a bad call is a Python error that names the problem. The interpreter never
crashes: no call reaches the C code with an operand it would read past."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from studylib.errors import StudylibError
from studylib.models import bf16_linear, cpu_linear, int8_linear, invariant, quant

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FORMATS = ("q8_0", "q4_0", "q4_1")
GOOD_X = (torch.float32, torch.bfloat16)


@st.composite
def calls(draw, dtypes=(torch.float32, torch.bfloat16, torch.float64, torch.int32)):
    """(x, weight fp32 (N, K), bias, problem): problem is None for a good call, else the word its error names."""
    k = draw(st.sampled_from([32, 64, 96, 160]))
    n = draw(st.integers(1, 40))
    rows = draw(st.integers(0, 70))
    lead = draw(st.sampled_from([(rows,), (1, rows), (2, rows // 2 + 1)]))
    dtype = draw(st.sampled_from(dtypes))
    width = k + draw(st.sampled_from([0, 0, 0, 0, 1, -32]))
    strided = draw(st.booleans())
    bias_kind = draw(st.sampled_from(["none", "good", "good", "short", "matrix"]))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(*lead, 2 * width if strided else width, generator=g)
    x = base[..., ::2] if strided else base  # a last-dimension stride of 2: the kernel needs a copy
    x = x.to(dtype) if dtype.is_floating_point else (x * 10).to(dtype)
    w = torch.randn(n, k, generator=g)
    bias = {"none": None, "good": torch.randn(n, generator=g), "short": torch.randn(max(n - 1, 0) + (n == 1) * 2,
                                                                                   generator=g),
            "matrix": torch.randn(n, 2, generator=g)}[bias_kind]
    problem = ("width" if width != k else "dtype" if dtype not in GOOD_X else
               "bias" if bias_kind in ("short", "matrix") else None)
    return x, w, bias, problem


def _expect_named_error(fn, problem: str):
    with pytest.raises((ValueError, StudylibError, RuntimeError, TypeError)) as err:
        fn()
    assert str(err.value), "an error without a message"


@SETTINGS
@given(call=calls(), fmt=st.sampled_from(FORMATS))
def test_block_linear_entries(call, fmt):
    x, w, bias, problem = call
    qt = quant.quantize(w, fmt)
    entries = []
    if quant.lib() is not None:
        entries.append(("fp32", lambda: quant.kernel_linear(x, qt, bias),
                        lambda: quant.reference_linear(x.float(), qt, bias)))
    for family in (int8_linear, bf16_linear):
        for path in family.available():
            entries.append((f"{family.__name__}:{path}",
                            lambda f=family, p=path: f.linear(x, qt, bias, isa=p),
                            lambda f=family: f.reference(x.float(), qt, bias)))
    for name, run, ref in entries:
        if problem:
            _expect_named_error(run, problem)
            continue
        got, want = run(), ref()
        assert got.shape == x.shape[:-1] + (w.shape[0],), name
        if name == "fp32":
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
        else:  # the int8 and bf16 arithmetics are exact against their references
            assert torch.equal(got, want), name


@SETTINGS
@given(call=calls())
def test_dense_linear_entries(call):
    x, w, bias, problem = call
    if cpu_linear.backend() == "stream":
        wd = w.to(x.dtype) if x.dtype in GOOD_X else w
        if problem:
            _expect_named_error(lambda: cpu_linear.stream_linear(x, wd, bias), problem)
        else:
            torch.testing.assert_close(cpu_linear.stream_linear(x, wd, bias).float(),
                                       cpu_linear.reference(x, wd, bias).float(), rtol=2e-2, atol=2e-2)
    if invariant.available()[0]:
        if problem or x.dtype is not torch.float32:
            _expect_named_error(lambda: invariant.gemm(x, w, bias), problem or "dtype")
        else:
            torch.testing.assert_close(invariant.gemm(x, w, bias), invariant.reference_gemm(x, w, bias),
                                       rtol=1e-4, atol=1e-4)


@SETTINGS
@given(seq=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 4)), min_size=1, max_size=4),
       heads=st.sampled_from([(4, 2), (4, 4), (2, 1)]), d=st.sampled_from([8, 16, 64]),
       fault=st.sampled_from([None, None, None, "slot", "offsets", "dtype", "heads"]))
def test_invariant_attention_entry(seq, heads, d, fault):
    """A ragged batch of (cached, new) sequences over one contiguous store; a bad index tensor, head count
    or dtype is refused by name before the C call."""
    if not invariant.available()[0]:
        pytest.skip("no invariant kernels here")
    H, Hkv = heads
    g = torch.Generator().manual_seed(len(seq) * 7 + d)
    total = sum(c + n for c, n in seq)
    store = torch.randn(total + 1, Hkv, d, generator=g)
    k_store, v_store = store, torch.randn(total + 1, Hkv, d, generator=g)
    slots, slot_off, tok_off, cached, nq, at = [], [0], [0], [], 0, 0
    for c, n in seq:
        slots += list(range(at, at + c + n))
        at += c + n
        slot_off.append(len(slots))
        nq += n
        tok_off.append(nq)
        cached.append(c)
    q = torch.randn(nq, H, d, generator=g)
    args = [q, k_store, v_store, Hkv * d, d, torch.tensor(slots), torch.tensor(slot_off), torch.tensor(tok_off),
            torch.tensor(cached), Hkv]
    if fault == "slot":
        args[5] = args[5].clone()
        args[5][-1] = total + 50
    elif fault == "offsets":
        args[6] = args[6][:-1]
    elif fault == "dtype":
        args[0] = q.double()
    elif fault == "heads":
        args[9] = 3
    if fault:
        _expect_named_error(lambda: invariant.attention(*args), fault)
        return
    out = invariant.attention(*args)
    assert out.shape == (nq, H, d) and torch.isfinite(out).all()
