"""Chapter 1 measurements: the autoregressive baseline and why it is bound by memory traffic (C1, C2).

Each function returns a DataFrame or a dict; ``judge_c1``/``judge_c2`` turn them into verdicts.
``ch01_report`` draws the figures and writes the sentence under each one from the numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from studylib.bench.roofline import decode_bytes_per_step, decode_flops_per_step, dtype_bytes
from studylib.bench.stats import estimate
from studylib.claims import Verdict, judge_all
from studylib.decoding.common import Stopwatch
from studylib.errors import StudylibError
from studylib.models import DenseKVCache, LlamaModel
from studylib.models.config import ModelConfig

# Published batch-1 decode numbers to read ours against (gpt-fast README, A100 power-limited to 330 W).
ANCHORS = pd.DataFrame([
    {"source": "gpt-fast (PyTorch, compiled)", "hardware": "A100-80GB (spec 2039 GB/s)", "model": "Llama-2-7B",
     "dtype": "bfloat16", "batch": 1, "tokens_per_s": 104.9, "achieved_gbs": 1397.3, "peak_gbs": 2039.0},
    {"source": "gpt-fast (PyTorch, compiled)", "hardware": "MI250x, one GCD (spec 1638 GB/s)",
     "model": "Llama-2-7B", "dtype": "bfloat16", "batch": 1, "tokens_per_s": 76.33, "achieved_gbs": 1028.7,
     "peak_gbs": 1638.0},
])
ANCHORS["fraction_of_peak_bandwidth"] = (ANCHORS["achieved_gbs"] / ANCHORS["peak_gbs"]).round(2)


def _random_ids(cfg: ModelConfig, batch: int, length: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, cfg.vocab_size, (batch, length), generator=gen).to(device)  # (B, T)


@torch.inference_mode()
def latency_curve(model: LlamaModel, prompt_ids: Sequence[int], max_new_tokens: int, repeats: int = 3) -> pd.DataFrame:
    """Time at which the n-th generated token is ready, for n = 1..max_new_tokens, per repeat.

    A plain greedy loop that never stops at EOS, so every repeat takes exactly ``max_new_tokens``
    steps: latency is then a function of the step count alone, which is what C1 is about.
    """
    rows = []
    for r in range(repeats + 1):  # the first pass is a warm-up and is not recorded
        cache = DenseKVCache(model.config, 1, len(prompt_ids) + max_new_tokens, model.device, model.dtype)
        ids = torch.as_tensor([list(prompt_ids)], device=model.device)  # (1, T)
        clock = Stopwatch(model.device)
        logits = model(ids, cache.begin(ids.shape[1]), logits="last").logits[:, -1]  # (1, V)
        for n in range(1, max_new_tokens + 1):
            tok = logits.argmax(-1, keepdim=True)  # (1, 1)
            if r:
                rows.append({"new_tokens": n, "seconds": clock.now() - clock.t0, "repeat": r})
            if n < max_new_tokens:
                logits = model(tok, cache.begin(1), logits="last").logits[:, -1]
    return pd.DataFrame(rows)


def fit_latency(curve: pd.DataFrame) -> dict:
    """Least-squares line seconds = intercept + slope * new_tokens, fitted per repeat.

    Per repeat, because the prompt's prefill time shifts a whole repeat up or down; pooling repeats
    would count that shift against linearity. Reports the median R^2 and slope over repeats, with
    the slope's bootstrap CI.
    """
    from scipy.stats import linregress

    fits = [linregress(g["new_tokens"], g["seconds"]) for _, g in curve.groupby("repeat")]
    slope = estimate([f.slope * 1e3 for f in fits])
    r2 = [f.rvalue**2 for f in fits]
    return {"slope_ms_per_token": slope.value, "slope_ci_ms": [slope.ci_low, slope.ci_high],
            "intercept_ms": float(np.median([f.intercept * 1e3 for f in fits])), "r2": float(np.median(r2)),
            "r2_min": float(min(r2)), "repeats": len(fits), "points": len(curve)}


@torch.inference_mode()
def step_time_vs_batch(model: LlamaModel, batches: Sequence[int], context: int, repeats: int = 5,
                       seed: int = 0) -> pd.DataFrame:
    """Seconds of one decode step for B sequences at a fixed context of ``context`` tokens.

    The cache is filled with random keys/values instead of a real prefill: the step's cost depends on
    the cache's size, not its contents, and a 32 x context prefill would dominate the run time.
    """
    rows = []
    for b in batches:
        cache = DenseKVCache(model.config, b, context + 1, model.device, model.dtype)
        for t in cache.k + cache.v:
            t.normal_()
        cache.begin(context)
        tok = _random_ids(model.config, b, 1, seed, model.device)  # (B, 1)
        for r in range(repeats + 1):
            cache.truncate(context)
            clock = Stopwatch(model.device)
            model(tok, cache.begin(1), logits="last")
            if r:  # r == 0 warms up this batch size's kernels
                rows.append({"batch": b, "step_s": clock.elapsed(), "repeat": r})
    df = pd.DataFrame(rows)
    df["tokens_per_s"] = df["batch"] / df["step_s"]
    return df


def batch_scaling(steps: pd.DataFrame) -> pd.DataFrame:
    """Per batch size: median step time with its CI, tokens/s, and time relative to batch 1."""
    out = []
    for b, g in steps.groupby("batch"):
        e = estimate(g["step_s"])
        out.append({"batch": int(b), "step_ms": e.value * 1e3, "step_ms_low": e.ci_low * 1e3,
                    "step_ms_high": e.ci_high * 1e3, "tokens_per_s": b / e.value})
    df = pd.DataFrame(out)
    df["time_vs_batch1"] = df["step_ms"] / df["step_ms"].iloc[0]
    df["tokens_vs_batch1"] = df["tokens_per_s"] / df["tokens_per_s"].iloc[0]
    return df


def knee_batch(scaling: pd.DataFrame) -> int | None:
    """Smallest batch whose step takes more than twice the batch-1 step (None: never within the sweep)."""
    over = scaling[scaling["time_vs_batch1"] > 2.0]
    return int(over["batch"].iloc[0]) if len(over) else None


def roofline_points(cfg: ModelConfig, scaling: pd.DataFrame, context: int, dtype: str) -> pd.DataFrame:
    """Arithmetic intensity (FLOP/byte, from the decode model) and achieved GFLOP/s per batch size."""
    size = dtype_bytes(dtype)
    rows = []
    for r in scaling.itertuples():
        flops = decode_flops_per_step(cfg, context, r.batch)
        nbytes = decode_bytes_per_step(cfg, context, size, r.batch)
        secs = r.step_ms / 1e3
        rows.append({"label": f"batch {r.batch}", "batch": r.batch, "intensity": flops / nbytes,
                     "gflops": flops / secs / 1e9, "achieved_gbs": nbytes / secs / 1e9,
                     "mbytes_per_step": nbytes / 1e6})
    return pd.DataFrame(rows)


def bandwidth_fraction(cfg: ModelConfig, steps: pd.DataFrame, context: int, dtype: str, bandwidth_gbs: float):
    """Estimate (with CI) of the batch-1 step's achieved bandwidth over the machine's measured bandwidth."""
    nbytes = decode_bytes_per_step(cfg, context, dtype_bytes(dtype), 1)
    secs = steps.loc[steps["batch"] == 1, "step_s"].to_numpy()
    return estimate(nbytes / secs / 1e9 / bandwidth_gbs)


_KV_PROBE = """
import ctypes, json, os, sys
ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD: big buffers come from (and go back to) the OS
import torch
from studylib.models import DenseKVCache
from studylib.models.config import ModelConfig
req = json.loads(sys.stdin.read())
cfg = ModelConfig(**req["cfg"])
dtype = getattr(torch, req["dtype"])
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
out = []
for b in req["batches"]:
    for ctx in req["contexts"]:
        before = rss()
        cache = DenseKVCache(cfg, b, ctx, "cpu", dtype)
        out.append({"batch": b, "context": ctx, "measured_bytes": rss() - before, "tensor_bytes": cache.nbytes})
        del cache
print(json.dumps(out))
"""


def kv_memory(cfg: ModelConfig, contexts: Sequence[int], batches: Sequence[int], dtype: str,
              device: str = "cpu") -> pd.DataFrame:
    """KV-cache memory measured by the process (resident memory on CPU, allocator on CUDA) vs. the
    formula 2 * layers * kv_heads * head_dim * bytes * context * batch.

    On CPU it runs in a fresh interpreter whose allocator returns freed buffers to the OS, so each
    measurement sees only its own cache (in this process, reused free memory would hide it).
    """
    if device.startswith("cuda"):
        rows = []
        for b in batches:
            for ctx in contexts:
                before = torch.cuda.memory_allocated()
                cache = DenseKVCache(cfg, b, ctx, device, getattr(torch, dtype))
                rows.append({"batch": b, "context": ctx, "measured_bytes": torch.cuda.memory_allocated() - before,
                             "tensor_bytes": cache.nbytes})
                del cache
    else:
        req = json.dumps({"cfg": cfg.to_dict(), "dtype": dtype, "batches": list(batches),
                          "contexts": list(contexts)})
        proc = subprocess.run([sys.executable, "-c", _KV_PROBE], input=req, capture_output=True, text=True,
                              check=True)
        rows = json.loads(proc.stdout)
    df = pd.DataFrame(rows)
    df["formula_bytes"] = [cfg.kv_bytes_per_token(dtype_bytes(dtype)) * c * b
                           for c, b in zip(df["context"], df["batch"], strict=True)]
    df["measured_mb"] = df["measured_bytes"] / 1e6
    df["formula_mb"] = df["formula_bytes"] / 1e6
    df["measured_over_formula"] = df["measured_bytes"] / df["formula_bytes"]
    df["kv_over_weights"] = df["formula_bytes"] / (cfg.num_params * dtype_bytes(dtype))
    return df


def judge_c1(fit: dict, scaling: pd.DataFrame, conditions: str, small_batch: int = 4,
             r2_threshold: float = 0.99) -> Verdict:
    """C1 holds if latency is linear in the step count (median R^2 >= 0.99) AND the step is memory-bound
    at small batch: B sequences per step (the largest swept B <= ``small_batch``) cost less than B/2
    single steps."""
    multi = scaling[scaling["batch"] > 1]
    if multi.empty:
        raise StudylibError("the batch sweep needs a batch size above 1 to judge C1; add one to `batches`.")
    small = multi[multi["batch"] <= small_batch]
    row = small.iloc[-1] if len(small) else multi.iloc[0]
    b, growth = int(row["batch"]), float(row["time_vs_batch1"])
    checks = {
        f"latency linear in output length (median R² = {fit['r2']:.4f} >= {r2_threshold})":
            fit["r2"] >= r2_threshold,
        f"memory-bound at batch {b} (step time x{growth:.2f} vs batch 1, < x{b / 2:g})": growth < b / 2,
    }
    return judge_all("C1", "R² of latency vs. output length (median over repeats)", checks,
                     f"linear (R² >= {r2_threshold})", conditions, chapter=1, measured=fit["r2"])


def judge_c2(fraction, points: pd.DataFrame, probe: dict, kv: pd.DataFrame, conditions: str,
             min_fraction: float = 0.5, kv_tolerance: float = 0.1) -> Verdict:
    """C2 holds if at batch 1 (a) the step's arithmetic intensity is below the machine's ridge point (so
    arithmetic cannot be the limit), (b) the measured step moves its weights + KV at >= ``min_fraction``
    of the measured bandwidth (memory traffic explains most of the time), and (c) the KV cache's measured
    memory matches the formula within ``kv_tolerance`` (held state grows with context and batch)."""
    intensity_b1, ridge = float(points["intensity"].iloc[0]), probe["ridge_flop_per_byte"]
    big = kv[kv["formula_bytes"] >= 32e6]  # small buffers are below the resident-memory resolution
    ratio = (big if len(big) else kv)["measured_over_formula"]
    checks = {
        f"batch-1 intensity {intensity_b1:.2g} FLOP/B below the ridge {ridge:.3g} FLOP/B": intensity_b1 < ridge,
        f"batch-1 step reaches {fraction.value:.0%} of measured bandwidth (>= {min_fraction:.0%})":
            fraction.ci_low >= min_fraction,
        f"KV memory = formula within {kv_tolerance:.0%} (measured/formula {ratio.min():.2f}-{ratio.max():.2f})":
            bool(((ratio - 1).abs() <= kv_tolerance).all()),
    }
    return judge_all("C2", "achieved fraction of memory bandwidth, batch 1", checks,
                     "memory traffic (weights + KV) dominates", conditions, chapter=1, measured=fraction)


def probe_machine(device: str, dtype: str, mbytes: int = 256, repeats: int = 3) -> dict:
    """Measured read bandwidth and matmul rate in the chapter's dtype, and the ridge point between them."""
    from studylib.bench.roofline import measure_bandwidth_gbs, measure_matmul_gflops

    bw = measure_bandwidth_gbs(device, mbytes=mbytes, repeats=repeats)
    peak = measure_matmul_gflops(device, getattr(torch, dtype), repeats=repeats)
    return {"device": device, "dtype": dtype, "threads": torch.get_num_threads(), "bandwidth_gbs": bw,
            "matmul_gflops": peak, f"matmul_gflops_{dtype}": peak, "ridge_flop_per_byte": peak / bw}
