"""CUDA backend: hand-written kernels in ``csrc/`` (window/sinks decode, block-sparse prefill).

Layout: the PyTorch reference, the extension loader (JIT-built once per torch version with
``torch.utils.cpp_extension.load`` and cached under ``$STUDYLIB_CACHE/torch_extensions``), then the
wrapper that checks shapes, dtypes and strides and picks a kernel. Without a GPU every entry point
raises ``StudylibError``; nothing falls back to another backend.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from studylib.attention.patterns import BlockSparse, Dense, Pattern, Sinks, Window, tile_table
from studylib.attention.torch_backend import attention_ref
from studylib.errors import StudylibError, require_cuda

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (CSRC / "binding.cpp", CSRC / "sparse_attention.cu")
HEAD_DIMS = (64, 128)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def attention_cuda_ref(q, k, v, pattern: Pattern, upcast: bool = True) -> torch.Tensor:
    """What the kernels compute, in plain PyTorch (the dense masked reference)."""
    return attention_ref(q, k, v, pattern, upcast=upcast)


@functools.lru_cache(maxsize=1)
def load_extension(verbose: bool = False):
    """Build (first call, ~1 minute) or load the cached extension module."""
    require_cuda("the cuda attention backend")
    from torch.utils.cpp_extension import load

    from studylib.cache import cache_dir

    build = cache_dir("torch_extensions", f"torch{torch.__version__.split('+')[0]}-cuda{torch.version.cuda}")
    try:
        return load(
            name="studylib_sparse_attn", sources=[str(s) for s in SOURCES], build_directory=str(build),
            extra_cflags=["-O3"], extra_cuda_cflags=["-O3", "--use_fast_math", "-lineinfo"],
            extra_include_paths=[str(CSRC)], verbose=verbose,
        )
    except Exception as exc:
        raise StudylibError(
            f"building the CUDA attention extension failed ({str(exc).strip().splitlines()[-1][:300]}); "
            "check that nvcc matches torch.version.cuda and rerun with load_extension(verbose=True)."
        ) from exc


def _check(q, k, v) -> None:
    require_cuda("the cuda attention backend")
    if q.device.type != "cuda":
        raise StudylibError(f"the cuda backend takes CUDA tensors; these are on {q.device}.")
    if q.dtype not in _DTYPES:
        raise StudylibError(f"the cuda backend takes float16, bfloat16 or float32, not {q.dtype}.")
    if q.shape[-1] not in HEAD_DIMS:
        raise StudylibError(f"the cuda kernels are built for head_dim in {HEAD_DIMS}, got {q.shape[-1]}.")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise StudylibError(f"{name} must be contiguous in head_dim (stride(-1) == 1); call .contiguous().")


def decode(q, k, v, pattern: Pattern, splits: int | None = None) -> torch.Tensor:
    """One query token: q (B, H, 1, D) over the sinks and the window of k/v (B, Hkv, Tk, D)."""
    if not isinstance(pattern, Dense | Window | Sinks):
        raise StudylibError(f"the cuda decode kernel handles dense/window/sinks, not {pattern.spec}.")
    B, H = q.shape[:2]
    n_keys = pattern.kv_budget(k.shape[2])
    if splits is None:
        # Fill ~2 CTAs per SM, but keep >= 256 keys per split so merging stays cheap.
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        splits = max(1, min(-(-2 * sms // (B * H)), n_keys // 256))
    return load_extension().window_decode(q, k, v, pattern.window, pattern.sinks, int(splits))


def prefill(q, k, v, pattern: Pattern) -> torch.Tensor:
    """Any pattern, any Tq <= Tk: the FlashAttention-style loop over the live key tiles."""
    ext = load_extension()
    Tq, Tk = q.shape[2], k.shape[2]
    dev = str(q.device)
    idx, cnt, _ = tile_table(pattern, Tq, Tk, ext.block_m, ext.block_n, dev)
    layout, lblock = None, 1
    if isinstance(pattern, BlockSparse):
        nb = -(-Tk // pattern.block)
        layout, lblock = pattern.layout(nb).to(torch.int8).contiguous().to(dev), pattern.block
    return ext.sparse_prefill(q, k, v, idx, cnt, layout, lblock, pattern.window, pattern.sinks)


def attention_cuda(q, k, v, pattern: Pattern) -> torch.Tensor:
    """The backend entry point ``attention(..., backend="cuda")`` calls (shapes already checked)."""
    _check(q, k, v)
    if q.shape[2] == 1 and not isinstance(pattern, BlockSparse):
        return decode(q, k, v, pattern)
    return prefill(q, k, v, pattern)
