"""Side-by-side autoregressive decode speed: studylib vs HF ``generate`` vs the roofline limit.

Same model, dtype, thread count and prompts, greedy, in one run. Each prompt is timed alternately
under both engines so drift in machine load hits both arms alike; speedups are paired ratios with a
bootstrap CI.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from studylib.bench.provenance import provenance
from studylib.bench.roofline import machine_probe, roofline_tokens_per_s
from studylib.bench.stats import estimate, ratio_estimate
from studylib.decoding import ar
from studylib.progress import progress_bar
from studylib.prompts import encode


def default_prompts(n: int) -> list:
    from studylib.data import load_workload

    return load_workload("chat", n=n, seed=0)


def split_engine(name: str) -> tuple[str, str]:
    """An engine as the chapters name it -> (weights, act): "gguf" -> ("gguf", "fp32"), "gguf@int8" ->
    ("gguf", "int8")."""
    weights, _, act = str(name).partition("@")
    return weights, act or "fp32"


def engine_dtype(name: str, dtype: str) -> str:
    """The dtype engine ``name`` loads in: a chapter's ``dtype`` is its dense model's; a block format (gguf,
    q4_1, ...) computes in fp32 whatever that is, as ``studylib bench --weights`` defaults it."""
    return dtype if split_engine(name)[0] == "dense" else "float32"


def run_ar_bench(
    model_name: str = "smollm2-135m",
    dtype: str = "bfloat16",
    n_prompts: int = 4,
    max_new_tokens: int = 128,
    repeats: int = 2,
    threads: int = 2,
    device: str = "cpu",
    out_dir: str | Path | None = None,
    probe: dict | None = None,
    progress: bool = True,
    weights: str = "dense",
    act: str = "fp32",
    base: tuple | None = None,
) -> dict:
    """``base``: (model, tokenizer) of ``model_name`` already loaded dense in ``dtype`` on ``device``; our
    engine (``models.sibling``) and the HF peer (``models.hf_twin``) are then made over its weights instead
    of two more loads, which a model of a few billion parameters cannot afford in 24 GB."""
    from studylib.models import from_loaded, hf_twin, load_hf_model, load_model

    torch.set_num_threads(threads)
    lm = base[0] if base is not None else None
    model = from_loaded(lm, model_name, device, dtype, weights, act)
    if model is not None:
        tok = base[1]
        # A random model's HF peer is built on our weights anyway; a checkpoint's reads its own files.
        hf = hf_twin(lm) if lm.config.random_weights else load_hf_model(model_name, device, dtype)
    else:
        model, tok = load_model(model_name, device, dtype, weights=weights, act=act)
        hf = load_hf_model(model_name, device, dtype)
    prompts = [encode(tok, r) for r in default_prompts(n_prompts)]
    eos = model.config.eos_token_ids[0] if model.config.eos_token_ids else None

    def hf_run(ids: list[int]) -> tuple[list[int], float]:
        x = torch.tensor([ids], device=model.device)
        t0 = time.perf_counter()
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                          do_sample=False, pad_token_id=eos)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        return out[0, len(ids):].tolist(), time.perf_counter() - t0

    # Warm-up both engines once (allocators, kernel selection) before anything is timed.
    ar.generate(model, prompts[0], 8, tokenizer=tok)
    hf_run(prompts[0][:16])

    ours_tps, hf_tps, ours_decode_tps, same, contexts, unit = [], [], [], [], [], []
    jobs = [(i, r) for r in range(repeats) for i in range(len(prompts))]
    for i, r in progress_bar(jobs, desc=f"ar bench {dtype}", progress=progress):
        ids = prompts[i]
        runs = [("ours", None), ("hf", None)] if r % 2 == 0 else [("hf", None), ("ours", None)]
        for name, _ in runs:
            if name == "ours":
                res = ar.generate(model, ids, max_new_tokens, tokenizer=tok)
                ours_tokens = res.token_ids
                ours_tps.append(res.new_tokens / res.wall_s)
                ours_decode_tps.append((res.new_tokens - 1) / max(res.wall_s - res.ttft_s, 1e-9))
            else:
                hf_tokens, wall = hf_run(ids)
                hf_tps.append(len(hf_tokens) / wall)
        same.append(ours_tokens == hf_tokens)
        contexts.append(len(ids) + len(ours_tokens) / 2)
        unit.append(i)  # repeats of one prompt are one unit: the CIs resample prompts

    probe = probe or machine_probe(device)
    mean_ctx = int(sum(contexts) / len(contexts))
    peak = probe.get(f"matmul_gflops_{dtype}")
    if dtype == "bfloat16" and device == "cpu":
        # The runtime widens bf16 weights to fp32 in registers (studylib.models.cpu_linear), so the
        # compute ceiling is the faster of the two rates, not the emulated bf16 GEMM's.
        peak = max(peak or 0.0, probe.get("matmul_gflops_float32") or 0.0) or None
    from studylib.models.weights import weight_bytes

    wbytes = None if weights == "dense" else weight_bytes(model)
    limit = roofline_tokens_per_s(model.config, mean_ctx, dtype, probe["bandwidth_gbs"], peak, weight_bytes=wbytes)
    result = {
        "model": model.config.name,
        "random_weights": model.config.random_weights,
        "dtype": dtype,
        "threads": threads,
        "max_new_tokens": max_new_tokens,
        "prompts": len(prompts),
        "repeats": repeats,
        "studylib_tok_s": estimate(ours_tps, units=unit).to_dict(),
        "studylib_decode_tok_s": estimate(ours_decode_tps, units=unit).to_dict(),
        "hf_tok_s": estimate(hf_tps, units=unit).to_dict(),
        # tokens/s ratio = HF time per token / ours, paired per prompt (its repeats averaged)
        "speedup_vs_hf": ratio_estimate([1 / x for x in hf_tps], [1 / x for x in ours_tps], units=unit).to_dict(),
        "roofline_tok_s": limit,
        "fraction_of_roofline": estimate([x / limit for x in ours_decode_tps], units=unit).to_dict(),
        "identical_to_hf": sum(same) / len(same),
        "mean_context": mean_ctx,
        "probe": probe,
        "provenance": provenance(model=model_name, dtype=dtype, weights=weights, act=act, threads=threads,
                                 device=device),
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".ar_{dtype}.json.tmp"
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(out / f"ar_{dtype}.json")
    return result


def summary_lines(result: dict) -> list[str]:
    s, h, sp = result["studylib_tok_s"], result["hf_tok_s"], result["speedup_vs_hf"]
    fr = result["fraction_of_roofline"]
    return [
        f"{result['model']} {result['dtype']} threads={result['threads']} ({result['prompts']} prompts x "
        f"{result['repeats']} repeats, {result['max_new_tokens']} new tokens, greedy)",
        f"  studylib   {s['value']:.1f} tok/s [{s['ci_low']:.1f}, {s['ci_high']:.1f}]",
        f"  HF generate {h['value']:.1f} tok/s [{h['ci_low']:.1f}, {h['ci_high']:.1f}]",
        f"  speedup vs HF {sp['value']:.2f}x [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]",
        f"  roofline {result['roofline_tok_s']:.1f} tok/s; studylib decode reaches {fr['value']:.0%} "
        f"[{fr['ci_low']:.0%}, {fr['ci_high']:.0%}]",
        f"  outputs identical to HF: {result['identical_to_hf']:.0%}",
    ]
