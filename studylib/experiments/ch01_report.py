"""Chapter 1 presentation: the tables, figures and sentences under each measurement.

The sentences are written from the numbers (never typed by hand), so they stay true whatever the run
measured.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from studylib import plots
from studylib.bench.roofline import decode_bytes_per_step, dtype_bytes
from studylib.experiments.ch01_baseline import ANCHORS, knee_batch
from studylib.models import LlamaModel
from studylib.models.config import ModelConfig
from studylib.workbook.tables import plural


def explain_latency(fit: dict) -> str:
    r2 = fit["r2_estimate"]
    linear = "a straight line" if r2["ci_low"] >= 0.99 else "not clearly a straight line"
    lo, hi = fit["slope_ci_ms"]
    lengths = ", ".join(str(x) for x in fit["lengths"])
    return (f"Latency is {linear} in the number of generated tokens: over {fit['prompts']} prompts, each "
            f"generated separately at {lengths} tokens, the per-prompt fit has median R² {r2['value']:.4f} "
            f"[{r2['ci_low']:.4f}, {r2['ci_high']:.4f}] (lowest {fit['r2_min']:.4f}); each token costs "
            f"{fit['slope_ms_per_token']:.1f} ms [{lo:.1f}, {hi:.1f}], on top of a fixed "
            f"{fit['intercept_ms']:.0f} ms for the prompt.")


def explain_batch(scaling: pd.DataFrame) -> str:
    last = scaling.iloc[-1]
    knee = knee_batch(scaling)
    # "doubles" is where a step stops being nearly free to widen; whether that is arithmetic or the extra
    # KV reads is the roofline's question (the section below), so the sentence does not say
    where = (f"the step time first doubles at batch {knee}"
             if knee else "the step time never doubles within this sweep: still memory-bound at the largest batch")
    return (f"Going from 1 to {int(last.batch)} sequences per step multiplies the step time by "
            f"{last.time_vs_batch1:.1f} but the tokens per second by {last.tokens_vs_batch1:.1f}; {where}.")


def explain_kv(kv: pd.DataFrame, cfg: ModelConfig, dtype: str) -> str:
    per_tok = cfg.kv_bytes_per_token(dtype_bytes(dtype))
    worst = kv.loc[kv["kv_over_weights"].idxmax()]
    return (f"Each token of context holds {per_tok / 1024:.3g} KiB of keys and values per sequence; at "
            f"context {int(worst.context)} and batch {int(worst.batch)} the cache is "
            f"{worst.kv_over_weights:.2f}x the size of the weights, and every decode step reads all of it.")


def setup_table(model: LlamaModel, probe: dict, context: int) -> pd.DataFrame:
    from studylib.bench.roofline import roofline_tokens_per_s

    cfg, dt = model.config, probe["dtype"]
    limit = roofline_tokens_per_s(cfg, context, dt, probe["bandwidth_gbs"], probe["matmul_gflops"])
    return pd.DataFrame([
        ("model", f"{cfg.name}{' (random weights)' if cfg.random_weights else ''}, {cfg.num_params / 1e6:.0f}M "
                  f"parameters, {cfg.num_layers} layers, {cfg.num_kv_heads} KV heads x {cfg.head_dim}"),
        ("weights in memory", f"{cfg.num_params * dtype_bytes(dt) / 1e6:.0f} MB ({dt})"),
        ("measured read bandwidth", f"{probe['bandwidth_gbs']:.1f} GB/s"),
        ("measured matmul rate", f"{probe['matmul_gflops']:.1f} GFLOP/s ({probe['threads']} threads)"),
        ("ridge point", f"{probe['ridge_flop_per_byte']:.2f} FLOP/byte"),
        (f"roofline limit, batch 1, context {context}", f"{limit:.1f} tokens/s"),
    ], columns=["quantity", "value"]).style.hide(axis="index")


def plot_latency(curve: pd.DataFrame, fit: dict):
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(7, 3.6))
    sns.lineplot(data=curve, x="new_tokens", y="seconds", units="prompt", estimator=None, marker="o",
                 color="steelblue", alpha=0.5, lw=0.8, ax=ax)
    n = np.array([curve["new_tokens"].min(), curve["new_tokens"].max()])
    ax.plot(n, (fit["intercept_ms"] + fit["slope_ms_per_token"] * n) / 1e3, ls="--", color="black", lw=1,
            label=f"median fit: {fit['slope_ms_per_token']:.1f} ms/token, median R²={fit['r2']:.4f}")
    ax.set(xlabel="tokens generated", ylabel="seconds (whole generation)",
           title=f"Latency vs. output length: {fit['prompts']} prompts, one generation per point")
    ax.legend()
    return plots.tidy(fig)


def plot_batch(scaling: pd.DataFrame):
    import matplotlib.pyplot as plt

    from studylib import plots

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    plots.lineplot_ci(scaling, "batch", "step_ms", low="step_ms_low", high="step_ms_high", ax=a, logx=True,
                      title="Time of one decode step")
    a.plot(scaling["batch"], scaling["step_ms"].iloc[0] * scaling["batch"], ls=":", color="grey",
           label="if cost grew with batch")
    a.set(xlabel="sequences per step (batch)", ylabel="ms per step", ylim=(0, scaling["step_ms_high"].max() * 1.2))
    a.legend()
    plots.lineplot_ci(scaling, "batch", "tokens_per_s", ax=b, logx=True, title="Throughput")
    b.set(xlabel="sequences per step (batch)", ylabel="tokens / s")
    fig.tight_layout()
    return plots.tidy(fig)


def plot_roofline(points: pd.DataFrame, probe: dict):
    import matplotlib.pyplot as plt

    from studylib import plots

    fig, ax = plt.subplots(figsize=(7, 4))
    plots.roofline(ax, probe["bandwidth_gbs"], probe["matmul_gflops"], points)
    return plots.tidy(fig)


def explain_roofline(points: pd.DataFrame, probe: dict) -> str:
    ridge = probe["ridge_flop_per_byte"]
    below = points[points["intensity"] < ridge]
    b1 = points.iloc[0]
    return (f"At batch 1 a decode step does {b1.intensity:.2f} FLOP per byte it moves, "
            f"{'far ' if b1.intensity < ridge / 4 else ''}{'below' if b1.intensity < ridge else 'above'} this "
            f"machine's ridge of {ridge:.2f} FLOP/byte; {len(below)} of {len(points)} batch sizes sit on the "
            f"bandwidth slope, where only fewer bytes (smaller weights, smaller KV) or more tokens per byte "
            f"(batching, speculation) can make decoding faster. Batch 1 moves {b1.achieved_gbs:.3g} GB/s of the "
            f"{probe['bandwidth_gbs']:.3g} GB/s measured.")


def plot_kv(kv: pd.DataFrame, cfg: ModelConfig, dtype: str):
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(7, 3.6))
    sns.lineplot(data=kv, x="context", y="measured_mb", hue="batch", marker="o", palette="crest", ax=ax)
    for _, g in kv.groupby("batch"):
        ax.plot(g["context"], g["formula_mb"], ls="--", color="black", lw=0.8)
    ax.axhline(cfg.num_params * dtype_bytes(dtype) / 1e6, color="firebrick", lw=1, ls=":")
    ax.annotate("weights", (kv["context"].min(), cfg.num_params * dtype_bytes(dtype) / 1e6),
                textcoords="offset points", xytext=(2, 3), fontsize="small", color="firebrick")
    ax.set(xlabel="context length (tokens)", ylabel="KV cache (MB)",
           title="KV-cache memory: measured (lines) vs. formula (dashed)")
    return plots.tidy(fig)


def bench_table(benches: dict) -> pd.DataFrame:
    """One row per engine (``--weights`` format) run, each with its own paired ratio to HF generate."""
    def ci(e: dict) -> str:
        return f"{e['value']:.1f} [{e['ci_low']:.1f}, {e['ci_high']:.1f}]"

    rows = []
    for weights, bench in benches.items():
        sp, fr = bench["speedup_vs_hf"], bench["fraction_of_roofline"]
        rows.append((f"studylib, --weights {weights}", ci(bench["studylib_tok_s"]),
                     f"{sp['value']:.2f}x [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]", f"{fr['value']:.0%} (decode only)",
                     f"{bench['roofline_tok_s']:.1f}"))
    first = next(iter(benches.values()))
    rows.append(("HF transformers generate", ci(first["hf_tok_s"]), "1x", "", ""))
    return pd.DataFrame(rows, columns=["engine", "tokens/s [95% CI]", "vs. HF (same run)", "of its roofline",
                                       "roofline tokens/s"]).style.hide(axis="index")


def engine_words(name: str) -> str:
    """"gguf" -> "the GGUF engine (the model's 4-bit blocks)", "gguf@int8" -> the same in int8 arithmetic."""
    from studylib.bench.ar_bench import split_engine

    weights, act = split_engine(name)
    base = "the GGUF engine (the model's 4-bit blocks)" if weights == "gguf" else f"{weights} weights"
    return base if act == "fp32" else f"{base} in {act} arithmetic"


def explain_bench(benches: dict) -> str:
    parts = []
    for weights, bench in benches.items():
        sp = bench["speedup_vs_hf"]
        same = bench["identical_to_hf"]
        rel = "faster than" if sp["ci_low"] > 1 else ("slower than" if sp["ci_high"] < 1 else "level with")
        engine = engine_words(weights)
        parts.append(f"With {engine}, on {plural(bench['prompts'], 'prompt')} x {plural(bench['repeats'], 'repeat')} of "
                     f"{bench['max_new_tokens']} tokens, this runtime is {rel} HF generate ({sp['value']:.2f}x) and "
                     f"reaches {bench['fraction_of_roofline']['value']:.0%} of its roofline while decoding; "
                     f"{same:.0%} of outputs are token-identical to HF's.")
    if len(parts) > 1:
        # bytes per token from the two rooflines (the same bandwidth over each engine's bytes per token)
        fewer = ""
        if {"dense", "gguf"} <= benches.keys() and benches["dense"].get("roofline_tok_s"):
            ratio = float(benches["gguf"]["roofline_tok_s"]) / float(benches["dense"]["roofline_tok_s"])
            fewer = f", {ratio:.1f}x fewer bytes per token (the ratio of their rooflines)"
        parts.append("The GGUF engine reads the model's own 4-bit blocks (chapter 8): the same weights as the "
                     f"fp32 model{fewer}, so its roofline is higher and its ratio to HF (which "
                     "runs the fp32 weights) is the gain of reading fewer bytes plus a fused decode step.")
    return " ".join(parts)


def anchor_table(fraction, probe: dict, model: LlamaModel, context: int) -> pd.DataFrame:
    """Published anchors with our batch-1 number on the same footing (achieved vs. measured bandwidth)."""
    cfg, dt = model.config, probe["dtype"]
    nbytes = decode_bytes_per_step(cfg, context, dtype_bytes(dt), 1)
    ours = {"source": "this study (dense eager engine, batch-sweep step, one process)", "hardware": f"this machine ({probe['threads']} threads, "
            f"measured {probe['bandwidth_gbs']:.1f} GB/s)", "model": cfg.name, "dtype": dt, "batch": 1,
            "tokens_per_s": fraction.value * probe["bandwidth_gbs"] * 1e9 / nbytes,
            "achieved_gbs": fraction.value * probe["bandwidth_gbs"], "peak_gbs": probe["bandwidth_gbs"],
            "fraction_of_peak_bandwidth": round(fraction.value, 2)}
    from studylib.plots import table

    return table(pd.concat([ANCHORS, pd.DataFrame([ours])], ignore_index=True))


def conditions_text(model: LlamaModel, probe: dict) -> str:
    from studylib.bench.provenance import cpu_model

    where = torch.cuda.get_device_name(0) if probe["device"].startswith("cuda") else cpu_model()
    return (f"{model.config.name} {probe['dtype']}, batch-1 greedy decoding, {probe['threads']} threads on "
            f"{where}")
