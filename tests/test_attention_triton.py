"""Triton kernels against the fp32 reference, on small awkward shapes.

Without CUDA they run under the Triton interpreter: TRITON_INTERPRET must be set before the kernels
are defined (triton reads it when ``@triton.jit`` decorates them), so it is set here, before the
backend module is imported. Only this module imports ``studylib.attention.triton_backend``. With
CUDA the same tests run the compiled kernels; the ``gpu`` tests add larger shapes.

Accuracy rule (as in FlashAttention's tests): the kernel's error against an fp32 reference is at
most twice the error of plain PyTorch in the same dtype, plus 1e-5.
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

tb = pytest.importorskip("studylib.attention.triton_backend")

from studylib.attention import Pattern, attention  # noqa: E402
from studylib.attention.patterns import BlockSparse  # noqa: E402
from studylib.attention.torch_backend import attention_ref  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"


def test_kernels_run_where_tensors_live():
    # Kernels compiled before TRITON_INTERPRET was set cannot take CPU tensors: fail loudly.
    assert CUDA or tb._interpreted(), "run this file in its own process so TRITON_INTERPRET takes effect"


def _inputs(b, h, hkv, tq, tk, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, tq, d, generator=g)
    k = torch.randn(b, hkv, tk, d, generator=g)
    v = torch.randn(b, hkv, tk, d, generator=g)
    return [t.to(DEVICE, dtype) for t in (q, k, v)]


def _check_error(out, q, k, v, pattern):
    ref = attention_ref(q.float(), k.float(), v.float(), pattern)
    torch_err = (attention_ref(q, k, v, pattern, upcast=False).float() - ref).abs().max().item()
    kernel_err = (out.float() - ref).abs().max().item()
    assert out.shape == q.shape and out.dtype == q.dtype
    assert kernel_err <= 2 * torch_err + 1e-5, (kernel_err, torch_err)


PREFILL = [  # spec, (B, H, Hkv, Tq, Tk, D), dtype
    ("dense", (1, 3, 1, 37, 37, 64), torch.float32),
    ("window:7", (1, 4, 1, 13, 50, 128), torch.bfloat16),
    ("sinks:3,5", (2, 2, 2, 33, 33, 64), torch.bfloat16),
    ("blocksparse:block=16,local=1,global=1,random=1,seed=2", (1, 3, 1, 45, 50, 64), torch.float32),
]


@pytest.mark.parametrize("spec,shape,dtype", PREFILL, ids=[p[0].split(":")[0] for p in PREFILL])
def test_prefill_matches_reference(spec, shape, dtype):
    b, h, hkv, tq, tk, d = shape
    q, k, v = _inputs(b, h, hkv, tq, tk, d, dtype, seed=tq)
    p = Pattern.parse(spec)
    _check_error(tb.prefill(q, k, v, p, block_m=16, block_n=16), q, k, v, p)


DECODE = [
    ("window:7", (1, 4, 4, 53, 64), torch.bfloat16, 2),
    ("sinks:3,5", (1, 12, 3, 70, 128), torch.float32, 3),
    ("dense", (2, 3, 1, 41, 64), torch.float32, None),
]


@pytest.mark.parametrize("spec,shape,dtype,splits", DECODE, ids=[p[0].split(":")[0] for p in DECODE])
def test_decode_matches_reference(spec, shape, dtype, splits):
    b, h, hkv, tk, d = shape
    q, k, v = _inputs(b, h, hkv, 1, tk, d, dtype, seed=tk)
    p = Pattern.parse(spec)
    _check_error(tb.decode(q, k, v, p, block_n=16, splits=splits), q, k, v, p)


class _HoleyLayout(BlockSparse):
    """Block row 1 sees nothing: its queries are fully masked rows (output defined as 0)."""

    def layout(self, n_blocks, device="cpu"):
        lay = super().layout(n_blocks, device).clone()
        lay[1] = False
        return lay


def test_fully_masked_rows_are_zero():
    p = _HoleyLayout(block=16, local=1, n_global=1)
    q, k, v = _inputs(1, 2, 1, 40, 45, 64, torch.float32, seed=5)  # queries at positions 5..44
    out = tb.prefill(q, k, v, p, block_m=16, block_n=16)
    empty = slice(16 - 5, 32 - 5)  # positions 16..31
    assert out[:, :, empty].eq(0).all()
    assert out[:, :, empty.stop:].abs().sum() > 0
    _check_error(out, q, k, v, p)


def test_public_entry_point_dispatches_prefill_and_decode():
    q, k, v = _inputs(1, 2, 1, 20, 20, 64, torch.float32, seed=9)
    out = attention(q, k, v, "sinks:2,6", backend="triton")
    _check_error(out, q, k, v, Pattern.parse("sinks:2,6"))
    out1 = attention(q[:, :, -1:], k, v, "sinks:2,6", backend="triton")
    torch.testing.assert_close(out1, out[:, :, -1:], atol=1e-5, rtol=1e-5)


def test_wrapper_rejects_bad_head_dim_and_strides():
    from studylib.errors import StudylibError

    q, k, v = _inputs(1, 2, 1, 8, 8, 48, torch.float32, seed=1)
    with pytest.raises(StudylibError, match="power of two"):
        attention(q, k, v, "dense", backend="triton")
    q, k, v = _inputs(1, 2, 1, 8, 8, 64, torch.float32, seed=1)
    with pytest.raises(StudylibError, match="contiguous"):
        tb.attention_triton(q.transpose(2, 3).contiguous().transpose(2, 3), k, v, Pattern.parse("dense"))


QUEST = [  # (B, H, Hkv, Tk, D), dtype, spec
    ((1, 4, 4, 100, 64), torch.float32, "quest:budget=53,page=16,sinks=0,recent=5,dense=0"),
    ((2, 9, 3, 257, 64), torch.bfloat16, "quest:budget=120,page=16,sinks=4,recent=20,dense=0"),
    ((1, 6, 2, 131, 32), torch.float32, "quest:budget=40,page=7,sinks=3,recent=9,dense=0"),
]


@pytest.mark.parametrize("shape,dtype,spec", QUEST, ids=["mha", "gqa-bf16", "odd-page"])
def test_quest_decode_matches_reference(shape, dtype, spec):
    from studylib.attention.quest import quest_attention_ref, quest_mask_ref

    b, h, hkv, tk, d = shape
    q, k, v = _inputs(b, h, hkv, 1, tk, d, dtype, seed=tk)
    p = Pattern.parse(spec)
    out = attention(q, k, v, p, backend="triton")
    ref = quest_attention_ref(q.float(), k.float(), v.float(), p)
    # Plain PyTorch in the same dtype over the same selection bounds the error a kernel may have.
    mask = quest_mask_ref(q, k, p).to(DEVICE)
    g = h // hkv
    scores = (q @ k.repeat_interleave(g, 1).transpose(-1, -2)) * d ** -0.5
    plain = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v.repeat_interleave(g, 1)
    torch_err = (plain.float() - ref).abs().max().item()
    assert out.shape == q.shape and out.dtype == q.dtype
    assert (out.float() - ref).abs().max().item() <= 2 * torch_err + 1e-5
    torch.testing.assert_close(out.float(), attention(q, k, v, p, backend="torch").float(), atol=2e-2, rtol=2e-2)


def test_quest_cache_on_the_triton_backend_equals_torch():
    from studylib.attention import make_cache
    from studylib.models import load_model

    model = load_model("tiny-random")[0]
    spec = "quest:budget=40,page=8,sinks=2,recent=6,dense=0"
    ids = torch.randint(3, 250, (1, 90), generator=torch.Generator().manual_seed(4))
    logits = {}
    with torch.inference_mode():
        for be in ("torch", "triton"):
            cache = make_cache(spec, model.config, 100, backend=be)
            model(ids, cache.begin(90))
            logits[be] = model(torch.tensor([[5]]), cache.begin(1)).logits
    torch.testing.assert_close(logits["triton"], logits["torch"], atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("spec", ["dense", "window:256", "sinks:4,252", "blocksparse:block=64,local=2,random=2"])
@pytest.mark.parametrize("tq,tk", [(1000, 1000), (1, 4097), (77, 3001)])
def test_gpu_kernels_at_realistic_sizes(spec, tq, tk):
    q, k, v = _inputs(2, 32, 8, tq, tk, 128, torch.bfloat16, seed=tq + tk)
    p = Pattern.parse(spec)
    _check_error(attention(q, k, v, p, backend="triton"), q, k, v, p)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("tk", [4097, 16385])
def test_gpu_quest_decode_at_realistic_sizes(tk):
    from studylib.attention.quest import quest_attention_ref

    q, k, v = _inputs(2, 32, 8, 1, tk, 128, torch.bfloat16, seed=tk)
    p = Pattern.parse("quest:budget=2048,page=16,sinks=4,recent=64,dense=0")
    out = attention(q, k, v, p, backend="triton")
    torch.testing.assert_close(out.float(), quest_attention_ref(q.float(), k.float(), v.float(), p).float(),
                               atol=3e-2, rtol=3e-2)
