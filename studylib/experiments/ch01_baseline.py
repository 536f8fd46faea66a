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
from studylib.bench.stats import estimate, rotated
from studylib.claims import CLAIMS, Verdict, decide_parts, judge_at_least, judge_checks
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
def _timed_greedy(model: LlamaModel, prompt_ids: Sequence[int], new_tokens: int) -> float:
    """Seconds for one whole generation of exactly ``new_tokens`` greedy tokens (prefill included).

    A plain loop that never stops at EOS, so the step count is the only thing that varies with
    ``new_tokens``: latency is then a function of the step count alone, which is what C1 is about."""
    cache = DenseKVCache(model.config, 1, len(prompt_ids) + new_tokens, model.device, model.dtype)
    ids = torch.as_tensor([list(prompt_ids)], device=model.device)  # (1, T)
    clock = Stopwatch(model.device)
    logits = model(ids, cache.begin(ids.shape[1]), logits="last").logits[:, -1]  # (1, V)
    for _ in range(new_tokens - 1):
        tok = logits.argmax(-1, keepdim=True)  # (1, 1)
        logits = model(tok, cache.begin(1), logits="last").logits[:, -1]
    logits.argmax(-1)
    return clock.elapsed()


def latency_by_length(model: LlamaModel, prompts: Sequence[Sequence[int]], lengths: Sequence[int]) -> pd.DataFrame:
    """End-to-end seconds of separate generations of each length in ``lengths``, for every prompt.

    Each (prompt, length) is its own generation, so a point's noise is independent of the others (a
    curve of cumulative timestamps inside one generation is linear by construction and proves
    nothing). The order of the lengths rotates from prompt to prompt so drift in machine load falls
    on every length alike."""
    if len(lengths) < 3:
        raise StudylibError("C1's fit needs at least three output lengths; give `lengths` three or more values.")
    _timed_greedy(model, prompts[0], 2)  # warm-up: allocations and kernel selection stay out of the timings
    rows = []
    for i, ids in enumerate(prompts):
        for n in rotated(lengths, i):
            rows.append({"prompt": i, "new_tokens": int(n), "seconds": _timed_greedy(model, ids, int(n))})
    return pd.DataFrame(rows)


def fit_latency(curve: pd.DataFrame) -> dict:
    """Least-squares line seconds = intercept + slope * new_tokens, fitted per prompt.

    Per prompt, because the prompt's prefill shifts its whole line up or down; pooling prompts would
    count that shift against linearity. The R^2 and the slope are estimates over prompts (median with a
    bootstrap CI, n = prompts), which is what the C1 rule judges."""
    from scipy.stats import linregress

    fits = [linregress(g["new_tokens"], g["seconds"]) for _, g in curve.groupby("prompt")]
    slope = estimate([f.slope * 1e3 for f in fits])
    r2 = estimate([f.rvalue**2 for f in fits])
    return {"slope_ms_per_token": slope.value, "slope_ci_ms": [slope.ci_low, slope.ci_high],
            "intercept_ms": float(np.median([f.intercept * 1e3 for f in fits])), "r2": r2.value,
            "r2_estimate": r2.to_dict(), "r2_min": float(min(r2.samples)), "prompts": len(fits),
            "lengths": sorted(int(x) for x in curve["new_tokens"].unique()), "points": len(curve)}


@torch.inference_mode()
def step_time_vs_batch(model: LlamaModel, batches: Sequence[int], context: int, repeats: int = 5,
                       seed: int = 0) -> pd.DataFrame:
    """Seconds of one decode step for B sequences at a fixed context of ``context`` tokens.

    The cache is filled with random keys/values instead of a real prefill: the step's cost depends on
    the cache's size, not its contents, and a 32 x context prefill would dominate the run time. The
    batch sizes are interleaved within each repeat (in an order that rotates per repeat), so a repeat is
    one unit in which every batch size was measured under the same machine state."""
    caches, toks = {}, {}
    for b in batches:
        cache = DenseKVCache(model.config, b, context + 1, model.device, model.dtype)
        for t in cache.k + cache.v:
            t.normal_()
        cache.begin(context)
        caches[b], toks[b] = cache, _random_ids(model.config, b, 1, seed, model.device)  # (B, 1)
    rows = []
    for r in range(repeats + 1):  # r == 0 warms up every batch size's kernels
        for b in rotated(batches, r):
            cache = caches[b]
            cache.truncate(context)
            clock = Stopwatch(model.device)
            model(toks[b], cache.begin(1), logits="last")
            if r:
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
# The first allocations of a fresh interpreter also map torch's own arenas; a throwaway cache first, so
# that every measured row sees only its own buffers.
DenseKVCache(cfg, 1, 16, "cpu", dtype)
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


def _beside(prompt_level) -> str:
    """The main run's prompt-level CI, shown beside a decision taken over whole runs."""
    e = prompt_level
    return (f"in this page's main run, over {e.n} prompts: {e.value:.3g} [{e.ci_low:.3g}, {e.ci_high:.3g}] "
            f"({getattr(e, 'method', 'bootstrap')}; shown, not deciding)")


def judge_c1(fit: dict, share: dict, conditions: str, share_runs=None, runs_note: str = "") -> list[Verdict]:
    """C1 has two parts, with the bars declared in ``decisions.yaml`` (C1@1): latency is linear in the step
    count (R² of the per-prompt fit) AND the batch-1 step is memory-bound: the share of the step that
    scales with the bytes it reads, from the fit of step time against bytes across weight formats
    (``ch01_formats.bytes_share``).

    The R² part is shown, not counted: an autoregressive loop over 8-64 tokens is a loop of near-equal
    steps, so its latency is linear by construction. The share decides, over whole runs
    (``share_runs``, one fit per fresh process, t on the log of the runs' shares); the main run's
    prompt-level CI stands beside it. Without whole runs the prompt-level CI is judged and, counting
    prompts where repeats are declared, the row rests on too few units to decide."""
    from studylib.decisions import declared

    d = declared("C1", 1)
    r2_bar = d.row("^R² of latency vs\\. output length").bar
    share_bar = d.row("^share of the batch-1 step that scales with the bytes read").bar
    linear = judge_at_least("C1", "R² of latency vs. output length (per-prompt fit, separate generations)",
                            fit["r2_estimate"], r2_bar, f"linear (R² ≥ {r2_bar:g})",
                            "; ".join(p for p in (conditions, "a loop of near-equal steps is linear by construction")
                                      if p), chapter=1, unit="prompts", by_construction=True)
    metric = (f"share of the batch-1 step that scales with the bytes read, {share['at']} "
              f"(fit across {len(share['engines'])} weight formats)")
    if share_runs is not None:
        bound = judge_at_least("C1", metric, share_runs, share_bar, "the step is bound by reading the weights",
                               "; ".join(p for p in (conditions, runs_note, _beside(share["estimate"])) if p),
                               chapter=1, unit="whole runs")
    else:
        bound = judge_at_least("C1", metric, share["estimate"], share_bar, "the step is bound by reading the weights",
                               conditions, chapter=1, unit="whole runs")
    return decide_parts("C1", "latency linear in steps AND the step memory-bound", [linear, bound],
                        CLAIMS["C1"].decides.split(";")[0], conditions, chapter=1)


def kv_check(kv: pd.DataFrame, tolerance: float = 0.1) -> dict:
    """Every measured KV cache against the formula, no row dropped: the fixed overhead a cache costs
    beyond its tensors (page rounding of its 2 x layers buffers, the same at every size) is estimated as
    the median of measured - formula and reported; each row passes if measured is within ``tolerance``
    of formula + that overhead."""
    over = float((kv["measured_bytes"] - kv["formula_bytes"]).median())
    dev = (kv["measured_bytes"] - kv["formula_bytes"] - over) / kv["formula_bytes"]
    return {"overhead_mb": over / 1e6, "worst": float(dev.abs().max()),
            "rows": {f"batch {int(r.batch)} x {int(r.context)} tokens: {r.measured_mb:.2f} MB vs formula "
                     f"{r.formula_mb:.2f} MB": bool(abs(d) <= tolerance)
                     for r, d in zip(kv.itertuples(), dev, strict=True)}}


def judge_c2(fraction_row, points: pd.DataFrame, probe: dict, kv: pd.DataFrame, conditions: str,
             fraction_runs=None, runs_note: str = "", engine: str | None = None) -> list[Verdict]:
    """C2's parts, with the bar declared in ``decisions.yaml`` (C2@1): on the fastest faithful engine
    (``ch01_formats.fastest_faithful_over_runs``, the rule declared before the run) the batch-1 step moves
    its bytes at >= the declared fraction of the measured bandwidth. That part decides, over whole runs
    (``fraction_runs``: each run's median fraction of the bandwidth that run measured, t on their logs);
    the main run's prompt-level CI stands beside it.

    Two more parts are shown and never counted, because they cannot fail: the batch-1 arithmetic
    intensity against the ridge point (the intensity is analytic: FLOPs over bytes of the decode model)
    and the KV cache's memory against the formula (it measures a tensor allocated at the formula's size)."""
    from studylib.decisions import declared

    bar = declared("C2", 1).row("^achieved fraction of memory bandwidth, batch 1, fastest faithful engine").bar
    intensity_b1, ridge = float(points["intensity"].iloc[0]), probe["ridge_flop_per_byte"]
    intensity = judge_checks("C2", "batch-1 arithmetic intensity below the ridge point", {
        f"{intensity_b1:.2g} FLOP/B < ridge {ridge:.3g} FLOP/B": intensity_b1 < ridge}, "memory-bound by shape",
        "; ".join(p for p in (conditions, "the intensity is analytic (FLOPs over bytes of the decode model)") if p),
        chapter=1, by_construction=True)
    name = engine or fraction_row.engine
    metric = f"achieved fraction of memory bandwidth, batch 1, fastest faithful engine ({name})"
    claimed = f"memory traffic explains ≥ {bar:.0%} of the step"
    if fraction_runs is not None:
        traffic = judge_at_least("C2", metric, fraction_runs, bar, claimed,
                                 "; ".join(p for p in (conditions, runs_note, _beside(fraction_row.estimate)) if p),
                                 chapter=1, unit="whole runs")
    else:
        traffic = judge_at_least("C2", metric, fraction_row.estimate, bar, claimed, conditions, chapter=1,
                                 unit="whole runs")
    check = kv_check(kv)
    held = judge_checks("C2", "KV-cache memory follows the formula", check["rows"],
                        "held state grows with context x batch",
                        "; ".join(p for p in (conditions, f"every row kept; a fixed {check['overhead_mb']:.2f} MB per "
                                              "cache beyond its tensors (page rounding) is reported, not hidden",
                                              "the cache is a tensor allocated at the formula's size") if p),
                        chapter=1, by_construction=True)
    return decide_parts("C2", "memory traffic and held state dominate", [intensity, traffic, held],
                        "memory traffic (weights + KV) dominates", conditions, chapter=1)


def probe_machine(device: str, dtype: str, mbytes: int = 256, repeats: int = 3) -> dict:
    """Measured read bandwidth and matmul rate in the chapter's dtype, and the ridge point between them."""
    from studylib.bench.roofline import measure_bandwidth_gbs, measure_matmul_gflops

    bw = measure_bandwidth_gbs(device, mbytes=mbytes, repeats=repeats)
    peak = measure_matmul_gflops(device, getattr(torch, dtype), repeats=repeats)
    return {"device": device, "dtype": dtype, "threads": torch.get_num_threads(), "bandwidth_gbs": bw,
            "matmul_gflops": peak, f"matmul_gflops_{dtype}": peak, "ridge_flop_per_byte": peak / bw}
