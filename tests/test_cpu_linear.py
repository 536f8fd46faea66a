"""The weight-streaming CPU linear: exact enough, row-invariant, and used only where it applies."""

import pytest
import torch
import torch.nn.functional as F

from studylib.errors import StudylibError
from studylib.models import cpu_linear
from studylib.models.cpu_linear import STREAM_MAX_ROWS, backend, linear, stream_linear

needs_stream = pytest.mark.skipif(backend() != "stream", reason="no C compiler or no AVX2/FMA here")


@needs_stream
@pytest.mark.parametrize("K,N", [(576, 1536), (37, 11), (8, 1), (15, 130), (1536, 576), (129, 67)])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 7, 9, 16, 33])
def test_stream_linear_matches_fp64_reference(M, K, N):
    g = torch.Generator().manual_seed(M * 1000 + K + N)
    x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)
    ref = F.linear(x.double(), w.double(), b.double())
    got = stream_linear(x, w, b)
    # fp32 dot products of length K: error grows like sqrt(K) * eps * |x||w|
    tol = 4 * (K ** 0.5) * torch.finfo(torch.float32).eps * (x.abs().max() * w.abs().max()).item() * 8
    assert got.dtype == torch.float32 and got.shape == (M, N)
    assert (got.double() - ref).abs().max().item() < tol
    assert torch.allclose(stream_linear(x, w), F.linear(x, w), rtol=1e-4, atol=1e-4)


@needs_stream
@pytest.mark.parametrize("M", [2, 5, 8, 13, 32])
def test_stream_linear_is_row_invariant(M):
    """A row's bits do not depend on the other rows or its place in the batch."""
    g = torch.Generator().manual_seed(M)
    x, w = torch.randn(M, 100, generator=g), torch.randn(70, 100, generator=g)
    together = stream_linear(x, w)
    alone = torch.cat([stream_linear(x[i : i + 1], w) for i in range(M)])
    assert torch.equal(together, alone)
    shuffled = torch.randperm(M, generator=g)
    assert torch.equal(stream_linear(x[shuffled], w), together[shuffled])


@needs_stream
def test_linear_keeps_shapes_and_strided_inputs():
    w, b = torch.randn(24, 40), torch.randn(24)
    x = torch.randn(2, 3, 80)[..., ::2]  # non-contiguous last dim
    assert torch.allclose(linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert linear(torch.randn(40), w).shape == (24,)
    assert linear(torch.randn(0, 40), w).shape == (0, 24)


def test_linear_hands_other_cases_to_f_linear():
    w = torch.randn(16, 32)
    big = torch.randn(STREAM_MAX_ROWS + 1, 32)  # prefill-sized: MKL's GEMM, bit for bit
    assert torch.equal(linear(big, w), F.linear(big, w))
    xh, wh = torch.randn(3, 32).half(), w.half()  # no fp16 kernel: oneDNN's
    assert torch.equal(linear(xh, wh), F.linear(xh, wh))
    # Training (autograd) never goes through the kernel, so gradients flow.
    wg = w.clone().requires_grad_()
    linear(torch.randn(2, 32), wg).sum().backward()
    assert wg.grad is not None and wg.grad.shape == w.shape


def test_backend_choice_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("STUDYLIB_CPU_LINEAR", "torch")
    assert backend() == "torch"
    x, w = torch.randn(2, 32), torch.randn(16, 32)
    assert torch.equal(linear(x, w), F.linear(x, w))
    monkeypatch.setenv("STUDYLIB_CPU_LINEAR", "fastest")
    with pytest.raises(StudylibError, match="STUDYLIB_CPU_LINEAR"):
        backend()


def test_forced_stream_without_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("STUDYLIB_CPU_LINEAR", "stream")
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))  # no cached build to fall back on
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(cpu_linear, "_state", {})
    with pytest.raises(StudylibError, match="C compiler"):
        backend()


@needs_stream
@pytest.mark.parametrize("M,K,N", [(1, 576, 1536), (5, 37, 11), (9, 130, 67)])
def test_bf16_weights_accumulate_in_fp32(M, K, N):
    """bf16 in, bf16 out: the fp32 dot product of the bf16 values, rounded once."""
    g = torch.Generator().manual_seed(K)
    x, w, b = (torch.randn(*s, generator=g).bfloat16() for s in ((M, K), (N, K), (N,)))
    got = stream_linear(x, w, b)
    assert got.dtype == torch.bfloat16
    exact = F.linear(x.double(), w.double(), b.double())
    # one bf16 rounding of an almost exact value: within one bf16 ulp (2^-8 relative) plus fp32 noise
    assert ((got.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-3 * K**0.5).all()
    alone = torch.cat([stream_linear(x[i : i + 1], w, b) for i in range(M)])
    assert torch.equal(got, alone)
    assert torch.equal(linear(x, w, b), got)
