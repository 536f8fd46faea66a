"""The hand-written CUDA kernels: they build with this machine's nvcc; numerics on a GPU only."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from studylib.attention import Pattern, attention
from studylib.attention import cuda_backend as cb
from studylib.attention.torch_backend import attention_ref
from studylib.errors import StudylibError

CUDA = torch.cuda.is_available()
NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).exists()), None)


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_kernels_compile_for_hopper(tmp_path):
    obj = tmp_path / "sparse_attention.o"
    cmd = [NVCC, "--std=c++17", "-arch=sm_90", "-O3", "-Xptxas", "-v", "-c", str(cb.CSRC / "sparse_attention.cu"),
           "-I", str(cb.CSRC), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert obj.stat().st_size > 10_000
    assert "warning" not in proc.stderr.lower(), proc.stderr[-2000:]
    # ptxas reports every instantiation (3 dtypes x 2 head dims x 3 kernels); none may spill registers.
    spills = re.findall(r"(\d+) bytes spill stores", proc.stderr)
    assert len(spills) >= 12 and set(spills) == {"0"}, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None or NVCC is None, reason="needs g++ and the CUDA headers")
def test_binding_parses_against_torch_headers(tmp_path):
    # The CPU wheel ships torch's CUDA headers but not one generated file; an empty stand-in
    # lets g++ check the binding's syntax and types (it is built for real on a CUDA machine).
    from torch.utils.cpp_extension import include_paths

    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    homes = [Path(NVCC).resolve().parent.parent, Path("/usr/local/cuda")]
    cuda_inc = next((h / "include" for h in homes if (h / "include" / "cuda_runtime.h").exists()), None)
    if cuda_inc is None:
        pytest.skip("no CUDA headers (cuda_runtime.h) next to nvcc")
    cmd = ["g++", "-std=c++20", "-fsyntax-only", f"-I{tmp_path}", *[f"-I{p}" for p in include_paths()],
           f"-I{cuda_inc}", f"-I{sysconfig.get_paths()['include']}", f"-I{cb.CSRC}",
           "-DTORCH_EXTENSION_NAME=studylib_sparse_attn", str(cb.CSRC / "binding.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.skipif(CUDA, reason="checks the no-GPU errors")
def test_no_gpu_means_a_clear_error_not_a_fallback():
    with pytest.raises(StudylibError, match="CUDA GPU"):
        cb.load_extension()
    q = torch.randn(1, 2, 1, 64)
    with pytest.raises(StudylibError, match="CUDA"):
        attention(q, q, q, "sinks:4,8", backend="cuda")


def test_sources_are_packaged():
    assert all(s.exists() for s in cb.SOURCES) and (cb.CSRC / "sparse_attention.h").exists()
    assert sys.modules["studylib.attention.cuda_backend"] is cb


# --- numerics, on a GPU ------------------------------------------------------------------------------
def _inputs(b, h, hkv, tq, tk, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, n, t, d, generator=g).to("cuda", dtype) for n, t in ((h, tq), (hkv, tk), (hkv, tk))]


def _check_error(out, q, k, v, pattern):
    ref = attention_ref(q.float(), k.float(), v.float(), pattern)
    torch_err = (attention_ref(q, k, v, pattern, upcast=False).float() - ref).abs().max().item()
    kernel_err = (out.float() - ref).abs().max().item()
    assert out.shape == q.shape and out.dtype == q.dtype
    assert kernel_err <= 2 * torch_err + 1e-5, (kernel_err, torch_err)


needs_gpu = pytest.mark.skipif(not CUDA, reason="needs CUDA")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spec", ["dense", "window:100", "sinks:4,60", "window:1"])
@pytest.mark.parametrize("h,hkv,d,tk,splits", [(4, 4, 64, 333, 1), (12, 3, 128, 1001, 3), (8, 2, 64, 70, None)])
def test_gpu_decode(dtype, spec, h, hkv, d, tk, splits):
    q, k, v = _inputs(2, h, hkv, 1, tk, d, dtype, seed=tk)
    p = Pattern.parse(spec)
    _check_error(cb.decode(q, k, v, p, splits=splits), q, k, v, p)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spec", ["dense", "window:37", "sinks:3,50", "blocksparse:block=64,local=2,global=1,random=2",
                                  "blocksparse:block=16,local=3,global=1,random=1,seed=4"])
@pytest.mark.parametrize("h,hkv,d,tq,tk", [(3, 1, 64, 257, 257), (4, 1, 128, 100, 301), (6, 2, 64, 1, 199)])
def test_gpu_prefill(dtype, spec, h, hkv, d, tq, tk):
    q, k, v = _inputs(2, h, hkv, tq, tk, d, dtype, seed=tq + tk)
    p = Pattern.parse(spec)
    _check_error(cb.prefill(q, k, v, p), q, k, v, p)
    _check_error(attention(q, k, v, p, backend="cuda"), q, k, v, p)
