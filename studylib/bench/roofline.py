"""The machine's limits and a bytes-per-decode-step model: how fast decoding could possibly go.

At batch 1 every decode step reads every weight once plus the whole KV cache, and does ~2 FLOPs per
weight. Dividing bytes by the measured bandwidth (and FLOPs by the measured matmul rate) gives the
roofline limit in tokens/s that the runtime's measured speed is compared against.
"""

from __future__ import annotations

import time

import torch

from studylib.models.config import ModelConfig


def _best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: page in the buffers, pick kernels
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_bandwidth_gbs(device: str = "cpu", mbytes: int = 512, repeats: int = 5) -> float:
    """Read bandwidth from memory: the best of two ways of reading a buffer once, over a buffer at least
    ``mbytes`` and, on a CPU, at least 4x its last-level cache (so the cache cannot serve it):

    - a reduction (``sum``), one stream;
    - a matrix-vector product over the buffer as a (rows, 4096) matrix: what a decode step does to its
      weights, and on some CPUs faster than a reduction (on the machine that made reports/cpu, a
      reduction alone read slower than a 1B model's decode steps did).

    A probe that reads slower than the engine it is a bound for makes every "fraction of bandwidth" above
    it meaningless, so the bound is the best method, not one of them."""
    nbytes = mbytes * (1 << 20)
    if torch.device(device).type == "cpu":
        from studylib.cpuinfo import last_level_cache_bytes

        nbytes = max(nbytes, 4 * last_level_cache_bytes())
    cols = 4096
    rows = max(1, nbytes // 4 // cols)
    w = torch.ones(rows, cols, dtype=torch.float32, device=device)
    v = torch.ones(cols, dtype=torch.float32, device=device)
    flat = w.view(-1)
    best = min(_best_seconds(lambda: flat.sum().item(), repeats), _best_seconds(lambda: (w @ v)[0].item(), repeats))
    return w.numel() * 4 / best / 1e9


def measure_matmul_gflops(device: str = "cpu", dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    secs = _best_seconds(lambda: a @ b, repeats)
    return 2 * n**3 / secs / 1e9


def machine_probe(device: str = "cpu", threads: int | None = None) -> dict:
    """Measured bandwidth (GB/s) and matmul rate (GFLOP/s, fp32 and bf16) of this machine."""
    if threads is not None:
        torch.set_num_threads(threads)
    return {
        "device": device,
        "threads": torch.get_num_threads(),
        "bandwidth_gbs": measure_bandwidth_gbs(device),
        "matmul_gflops_float32": measure_matmul_gflops(device, torch.float32),
        # Small n: on CPUs without native bf16 (AVX2 only) bf16 matmul is ~100x slower than fp32.
        "matmul_gflops_bfloat16": measure_matmul_gflops(device, torch.bfloat16, n=256 if device == "cpu" else 1024),
    }


def dtype_bytes(dtype: torch.dtype | str) -> int:
    if isinstance(dtype, str):
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return torch.empty(0, dtype=dtype).element_size()


def decode_bytes_per_step(cfg: ModelConfig, context_len: int, dtype_size: int, batch: int = 1,
                          weight_bytes: float | None = None) -> float:
    """Bytes one decode step must move: every weight once (shared by the batch), each sequence's KV
    read over ``context_len`` tokens plus its new KV written. The embedding lookup reads only one row
    per token, but a tied lm_head reads the whole matrix, so the embedding counts in full either way.
    ``weight_bytes``: the measured size of block-format weights (``models.weights.weight_bytes``)."""
    weights = cfg.num_params * dtype_size if weight_bytes is None else weight_bytes
    kv = batch * (context_len + 1) * cfg.kv_bytes_per_token(dtype_size)
    return weights + kv


def decode_flops_per_step(cfg: ModelConfig, context_len: int, batch: int = 1) -> float:
    matmul = 2 * cfg.num_params * batch
    attn = 4 * batch * cfg.num_layers * cfg.num_heads * cfg.head_dim * (context_len + 1)
    return matmul + attn


def roofline_tokens_per_s(
    cfg: ModelConfig, context_len: int, dtype: torch.dtype | str, bandwidth_gbs: float,
    peak_gflops: float | None = None, batch: int = 1, weight_bytes: float | None = None,
) -> float:
    """Upper bound on decode tokens/s (all sequences together) from bandwidth and, if given, compute."""
    secs = decode_bytes_per_step(cfg, context_len, dtype_bytes(dtype), batch, weight_bytes) / (bandwidth_gbs * 1e9)
    if peak_gflops:
        secs = max(secs, decode_flops_per_step(cfg, context_len, batch) / (peak_gflops * 1e9))
    return batch / secs
