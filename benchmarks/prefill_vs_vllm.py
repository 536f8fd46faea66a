"""Time to first token of ~500-token prompts: our engine against vLLM CPU on the same machine.

Step 1 exports the prompts (the first ``--tokens`` tokens of held-out XSum articles, as token ids);
step 2 runs vLLM on them in its own venv (``benchmarks/peers/vllm_prefill.py``, once per dtype);
step 3 measures ours on the same prompts, arms interleaved, and writes the paired ratios (vLLM's TTFT
over ours, median with a bootstrap 95% CI over prompts: above 1 means ours is faster).

    .venv/bin/python benchmarks/prefill_vs_vllm.py export --out /tmp/prefill_prompts.jsonl
    .venv-vllm/bin/python benchmarks/peers/vllm_prefill.py --model "$MODEL_DIR" \\
        --prompts /tmp/prefill_prompts.jsonl --out /tmp/vllm_prefill_bfloat16.json --dtype bfloat16
    .venv/bin/python benchmarks/prefill_vs_vllm.py compare --prompts /tmp/prefill_prompts.jsonl \\
        --vllm /tmp/vllm_prefill_bfloat16.json --out reports/bench/prefill_vs_vllm.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from studylib.bench.provenance import cpu_model, other_machine, provenance
from studylib.bench.stats import estimate, ratio_estimate, rotated
from studylib.models import load_model

ARMS = {"gguf x fp32": ("gguf", "fp32"), "gguf x int8": ("gguf", "int8"), "gguf+bf16prefill": ("gguf+bf16prefill", "fp32")}


def export(out: Path, n: int, tokens: int) -> None:
    from studylib.experiments.ch08_compression import documents

    _, tok = load_model("smollm2-135m")
    docs = documents(tok, n, tokens, seed=1)
    out.write_text("".join(json.dumps({"id": i, "prompt_token_ids": d}) + "\n" for i, d in enumerate(docs)))
    print(f"{len(docs)} prompts of {tokens} tokens -> {out}")


@torch.inference_mode()
def ttft(model, ids: list[int]) -> float:
    """Prompt in, first token out: one prefill forward and the greedy pick (as ar.generate's TTFT)."""
    from studylib.attention import make_cache

    cache = make_cache("dense", model.config, len(ids) + 1, model.device, model.dtype)
    t0 = time.perf_counter()
    logits = model(torch.tensor([ids]), cache.begin(len(ids)), logits="last").logits
    int(logits[0, -1].argmax())
    return time.perf_counter() - t0


def compare(prompts: Path, vllm_paths: list[Path], out: Path, threads: int, repeats: int) -> None:
    torch.set_num_threads(threads)
    rows = [json.loads(line) for line in prompts.read_text().splitlines() if line.strip()]
    peers = [json.loads(p.read_text()) for p in vllm_paths]
    for p, path in zip(peers, vllm_paths, strict=True):
        if why := other_machine(p, threads, "this run"):
            raise SystemExit(f"{path} cannot stand beside this run: {why}; rerun it here.")
    models = {name: load_model("smollm2-135m", weights=w, act=a)[0] for name, (w, a) in ARMS.items()}
    for m in models.values():
        ttft(m, rows[0]["prompt_token_ids"])  # warm-up
    secs: dict[str, dict[int, list[float]]] = {name: {} for name in models}
    for k in range(repeats):
        for i, r in enumerate(rows):
            for name in rotated(list(models), k + i):
                secs[name].setdefault(r["id"], []).append(ttft(models[name], r["prompt_token_ids"]))
    ids = [r["id"] for r in rows]
    ours = {name: [sorted(secs[name][i])[len(secs[name][i]) // 2] for i in ids] for name in models}
    res = {"cpu": cpu_model(), "threads": threads, "prompts": len(ids), "repeats": repeats,
           "prompt_tokens": estimate([len(r["prompt_token_ids"]) for r in rows]).to_dict(),
           "ours_ttft_s": {name: estimate(v).to_dict() for name, v in ours.items()}, "vs_vllm": {},
           "provenance": provenance(model="smollm2-135m", arms=list(ARMS), threads=threads)}
    for p in peers:
        theirs = {r["id"]: r["ttft_s"] for r in p["prompts"]}
        key = f"vLLM {p['dtype']}"
        res["vs_vllm"][key] = {"vllm_ttft_s": estimate([theirs[i] for i in ids]).to_dict(), "vllm_version": p["vllm_version"]}
        for name, v in ours.items():
            e = ratio_estimate([theirs[i] for i in ids], v)
            res["vs_vllm"][key][name] = e.to_dict()
            print(f"{name}: TTFT {estimate(v).value:.3f} s; {key} {estimate([theirs[i] for i in ids]).value:.3f} s; "
                  f"vLLM / ours {e.value:.2f} [{e.ci_low:.2f}, {e.ci_high:.2f}] (n={e.n})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--n", type=int, default=10)
    e.add_argument("--tokens", type=int, default=500)
    c = sub.add_parser("compare")
    c.add_argument("--prompts", type=Path, required=True)
    c.add_argument("--vllm", type=Path, nargs="+", required=True)
    c.add_argument("--out", type=Path, default=Path("reports/bench/prefill_vs_vllm.json"))
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    if a.cmd == "export":
        export(a.out, a.n, a.tokens)
    else:
        compare(a.prompts, a.vllm, a.out, a.threads, a.repeats)


if __name__ == "__main__":
    main()
