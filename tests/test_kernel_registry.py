"""The kernel library's registry is the one table of what computes what: every C source is in it, every
entry names a wrapper, a switch and a pure-PyTorch reference that exist, and its row bounds are the ones
the dispatching code uses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from studylib.errors import StudylibError
from studylib.models import cpu_linear, invariant, kernels, quant

ROOT = Path(kernels.__file__).resolve().parents[1]


def test_every_c_source_is_a_registered_kernel():
    sources = {str(p.relative_to(ROOT)) for p in ROOT.glob("**/csrc/*.c")}
    assert sources == {k.source for k in kernels.KERNELS}


def test_every_entry_names_a_wrapper_a_reference_and_a_path():
    import importlib

    for k in kernels.KERNELS:
        importlib.import_module(k.wrapper)
        assert callable(k.reference_fn()), k.name
        assert not k.path().startswith("unknown"), (k.name, k.path())
    assert set(kernels.paths()) == set(kernels.BY_NAME)


def test_the_registry_bounds_are_the_dispatchers():
    assert kernels.DECODE_ROWS == cpu_linear.STREAM_MAX_ROWS
    assert kernels.BLOCK_DECODE_ROWS == quant.KERNEL_MAX_ROWS


@pytest.mark.parametrize(("weights", "act", "rows", "expect"), [
    ("dense", "fp32", 1, "stream_linear"), ("dense", "fp32", 33, kernels.TORCH),
    ("gguf", "fp32", 1, "quant_linear"), ("q4_1", "fp32", 64, "quant_linear"), ("q8_0", "fp32", 65, kernels.TORCH),
    ("gguf", "int8", 1, "int8_linear"), ("gguf", "int8", 500, "int8_linear"),
    ("q4_0", "bf16", 17, "bf16_linear"), ("q4_1+bf16prefill", "fp32", 500, kernels.TORCH),
    ("q4_1+bf16prefill", "fp32", 8, "quant_linear"),
])
def test_kernel_for_names_the_kernel_of_each_cell(weights, act, rows, expect):
    phase = kernels.phase_of("dense" if weights == "dense" else "blocks", rows)
    assert kernels.kernel_for(weights, act, phase) == expect


def test_a_bad_cell_is_one_clear_error():
    for args, word in ((("fp8", "fp32", "decode"), "weight format"), (("gguf", "int4", "decode"), "arithmetic"),
                       (("gguf", "fp32", "warmup"), "phase")):
        with pytest.raises(StudylibError, match=word):
            kernels.kernel_for(*args)
    with pytest.raises(StudylibError, match="no kernel"):
        kernels.kernel("nope")


def test_the_table_lists_every_cell_once():
    t = kernels.table()
    assert not t.duplicated(["weights", "act", "phase"]).any()
    assert set(t.kernel) == set(kernels.BY_NAME)


def test_references_agree_with_their_kernels():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(5, 64, generator=g), torch.randn(48, 64, generator=g), torch.randn(48, generator=g)
    if cpu_linear.backend() == "stream":
        torch.testing.assert_close(cpu_linear.stream_linear(x, w, b), cpu_linear.reference(x, w, b))
    qt = quant.quantize(w, "q4_1")
    if quant.lib() is not None:
        torch.testing.assert_close(quant.kernel_linear(x, qt, b), quant.reference_linear(x, qt, b),
                                   rtol=1e-5, atol=1e-4)
    if invariant.available()[0]:
        torch.testing.assert_close(invariant.gemm(x, w, b), invariant.reference_gemm(x, w, b))
        q, k, v = (torch.randn(2, h, n, 16, generator=g) for h, n in ((4, 3), (2, 8), (2, 8)))
        torch.testing.assert_close(invariant.dense_attention(q, k, v, 5), invariant.dense_attention_ref(q, k, v, 5),
                                   rtol=1e-5, atol=1e-5)
