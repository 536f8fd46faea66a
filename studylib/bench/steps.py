"""``studylib bench steps``: what one step costs against the rows in it, v(k), and the ridge point.

Parallel decoding (verification of k drafted tokens, Jacobi windows, batches of k requests) pays only
while a k-row step costs about what a 1-row step costs: while the step is bound by reading the
weights. This measures it on the engine's own step (the model's forward over k new rows after a
``context``-token cache, the same call AR, verification and batching make), with the repeats and row
counts interleaved, and sets beside it a roofline *model*:

    t_model(k) = max(weight bytes / bandwidth, k * multiply-adds per row / peak)

whose ridge point k* = (bytes / bandwidth) / (multiply-adds per row / peak) is where the model says
the step turns compute-bound. ``peak`` is measured, not quoted: the rate of the very kernel the step
uses (this arithmetic, this ISA path) on a 64-row product whose weight stays in cache; ``bandwidth`` is
``roofline.measure_bandwidth_gbs``. The model is labelled as one and never replaces the measurement.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from studylib.bench.stats import estimate, ratio_estimate, rotated
from studylib.errors import StudylibError
from studylib.progress import progress_bar

PEAK_ROWS = 64  # rows of the cache-resident product that measures the kernel's peak


def parse_rows(text: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4] (sorted, unique); 1 is added where missing: v(k) is relative to it."""
    try:
        rows = sorted({int(t) for t in str(text).split(",") if t.strip()})
    except ValueError:
        raise StudylibError(f"--rows takes comma-separated positive integers (e.g. 1,2,4,8), got {text!r}.") from None
    if not rows or rows[0] < 1:
        raise StudylibError(f"--rows takes comma-separated positive integers (e.g. 1,2,4,8), got {text!r}.")
    return sorted({1, *rows})


def kernel_path(model) -> str:
    """The linear kernel a step of ``model`` runs, in words: act, ISA build (provenance records it too)."""
    from studylib.models import cpu_linear, quant

    if model.weights_format == "dense":
        return f"dense {str(model.dtype).replace('torch.', '')} ({cpu_linear.backend()})"
    if model.act != "fp32":
        return f"{model.weights_format} x {model.act} ({quant.act_kernel(model.act).path()})"
    return f"{model.weights_format} x fp32 ({quant.isa()})"


def macs_per_row(model) -> int:
    """Multiply-adds of the linears (head included) for one row."""
    from studylib.models.weights import linear_weights

    return int(sum(int(np.prod(w.shape)) for w in linear_weights(model)))


@torch.inference_mode()
def measure_peak_gmacs(model, repeats: int = 5) -> float:
    """The rate (G multiply-adds/s) of the kernel this model's steps use, on ``PEAK_ROWS`` rows against
    its largest layer weight, warm in cache: the compute ceiling of this arithmetic on this ISA path."""
    from studylib.models import cpu_linear
    from studylib.models.quant import QuantTensor, linear
    from studylib.models.weights import linear_weights

    ws = linear_weights(model)[:-1] or linear_weights(model)  # layer weights; the head only if nothing else
    w = max(ws, key=lambda t: int(np.prod(t.shape)))
    x = torch.randn(PEAK_ROWS, w.shape[1], dtype=torch.float32)
    if isinstance(w, QuantTensor):
        def fn():
            return linear(x, w)
    else:
        xw = x.to(w.dtype)

        def fn():
            return cpu_linear.linear(xw, w)
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return PEAK_ROWS * int(np.prod(w.shape)) / best / 1e9


@torch.inference_mode()
def step_times(model, rows: list[int], context: int, repeats: int, progress: bool = True) -> pd.DataFrame:
    """Seconds of one forward of k new rows (causal, logits of every row) after ``context`` cached
    tokens, for every k in ``rows``, ``repeats`` times, the row counts rotated within each repeat."""
    from studylib.attention import make_cache
    from studylib.models import decode_layers

    if context < 1:
        raise StudylibError(f"--context must be >= 1 (the step reads a cache), got {context}.")
    window = model.config.max_position_embeddings
    if context + max(rows) > window:
        raise StudylibError(f"--context {context} + {max(rows)} rows exceed the model's window of {window}; "
                            "lower one of them.")
    cache = make_cache("dense", model.config, context + max(rows), model.device, model.dtype)
    vocab = model.config.vocab_size
    ids = (torch.arange(context) * 7919 % (vocab - 10) + 10)[None]
    model(ids, cache.begin(context), logits="none")
    out = []
    for k in rows:  # one untimed step of each size first (allocator, first-touch)
        model(torch.arange(20, 20 + k)[None], cache.begin(k), logits="all")
        cache.truncate(context)
    for r in progress_bar(range(repeats), desc="step cost", progress=progress):
        for k in rotated(rows, r):
            x = (torch.arange(k) * 31 % (vocab - 10) + 10)[None]
            path = decode_layers.path(model, cache, k)
            t0 = time.perf_counter()
            model(x, cache.begin(k), logits="all")
            out.append({"rows": k, "repeat": r, "seconds": time.perf_counter() - t0, "path": path})
            cache.truncate(context)
    return pd.DataFrame(out)


def summarise(times: pd.DataFrame) -> pd.DataFrame:
    """Per row count: median ms (CI over repeats) and v(k) = t(k) / t(1), paired by repeat."""
    t1 = times[times.rows == 1].sort_values("repeat").seconds.to_numpy()
    rows = []
    for k, g in times.groupby("rows"):
        g = g.sort_values("repeat")
        e = estimate(g.seconds.to_numpy())
        v = ratio_estimate(g.seconds.to_numpy(), t1)
        rows.append({"rows": int(k), "ms": 1e3 * e.value, "ms_low": 1e3 * e.ci_low, "ms_high": 1e3 * e.ci_high,
                     "v": v.value, "v_low": v.ci_low, "v_high": v.ci_high, "n": e.n, "path": g.path.iloc[0]})
    return pd.DataFrame(rows)


def roofline_model(rows: list[int], weight_bytes: int, macs: int, bandwidth_gbs: float, peak_gmacs: float) -> dict:
    """The roofline model of a k-row step (a model, not a measurement): its ridge point and v_model(k)."""
    t_mem = weight_bytes / (bandwidth_gbs * 1e9)
    t_row = macs / (peak_gmacs * 1e9)
    t = {k: max(t_mem, k * t_row) for k in rows}
    return {"ridge_rows": t_mem / t_row, "t_memory_ms": 1e3 * t_mem, "t_compute_per_row_ms": 1e3 * t_row,
            "v_model": {str(k): t[k] / t[1] for k in rows}}


def run_steps(model_name: str, weights: str, act: str, rows: list[int], context: int, repeats: int,
              threads: int = 2, out_dir: str | Path | None = None, progress: bool = True) -> dict:
    from studylib.bench.provenance import provenance
    from studylib.bench.roofline import measure_bandwidth_gbs
    from studylib.models import load_model
    from studylib.models.weights import weight_bytes

    if repeats < 2:
        raise StudylibError(f"--repeats must be >= 2 for a CI, got {repeats}.")
    torch.set_num_threads(threads)
    model, _ = load_model(model_name, "cpu", "float32", weights=weights, act=act)
    times = step_times(model, rows, context, repeats, progress)
    table = summarise(times)
    bw = measure_bandwidth_gbs("cpu")
    peak = measure_peak_gmacs(model)
    wb = weight_bytes(model)
    result = {
        "model": model.config.name, "random_weights": model.config.random_weights, "weights": weights,
        "act": act, "kernel": kernel_path(model), "context": context, "repeats": repeats, "threads": threads,
        "steps": table.to_dict("records"), "bandwidth_gbs": bw, "peak_gmacs": peak, "weight_bytes": wb,
        "macs_per_row": macs_per_row(model),
        "model_curve": roofline_model(rows, wb, macs_per_row(model), bw, peak),
        "provenance": provenance(model=model_name, weights=weights, act=act, rows=rows, context=context,
                                 repeats=repeats, threads=threads),
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        name = f"steps_{weights}_{act}.json".replace("+", "_")
        tmp = out / f".{name}.tmp"
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(out / name)
    return result


def summary_lines(result: dict) -> list[str]:
    m = result["model_curve"]
    lines = [f"{result['model']} --weights {result['weights']} --act {result['act']}: {result['kernel']}, "
             f"context {result['context']}, {result['repeats']} interleaved repeats, {result['threads']} threads",
             "rows   ms (95% CI)            v(k) (95% CI)        v_model(k)  path"]
    for s in result["steps"]:
        lines.append(f"{s['rows']:4d}  {s['ms']:7.2f} [{s['ms_low']:.2f}, {s['ms_high']:.2f}]   "
                     f"{s['v']:5.2f} [{s['v_low']:.2f}, {s['v_high']:.2f}]   {m['v_model'][str(s['rows'])]:6.2f}     "
                     f"{s['path']}")
    lines.append(f"measured: bandwidth {result['bandwidth_gbs']:.1f} GB/s, kernel peak {result['peak_gmacs']:.1f} "
                 f"G multiply-adds/s; model (roofline, not a measurement): ridge at {m['ridge_rows']:.1f} rows")
    return lines
