"""Single-stream decode of the embedded GGUF: our engine (fp32 and int8 activations) against llama.cpp.

The llama.cpp side runs in its own venv (benchmarks/peers/README.md) on chapter 8's exported prompts;
this script reads its JSON, decodes the same prompts with our engine on the same thread count, and
writes per-prompt decode rates, the paired ratio ours / llama.cpp (median, bootstrap 95% CI over
prompts) and how many greedy outputs agree with llama.cpp's (which rounds activations to 8 bits, as
``--act int8`` does). Run both within minutes of each other on one machine:

    GGUF=$(.venv/bin/python -c 'from studylib.models.hub import smollm2_gguf; print(smollm2_gguf())')
    .venv-llama/bin/python benchmarks/peers/llamacpp_peer.py --gguf "$GGUF" \\
        --prompts reports/cpu/peers/ch08_prompts.jsonl --out /tmp/llama_cpp.json --threads 2
    .venv/bin/python benchmarks/decode_vs_llamacpp.py --llama /tmp/llama_cpp.json --out reports/bench/decode_vs_llamacpp.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from studylib.bench.provenance import cpu_model, other_machine, provenance
from studylib.bench.stats import estimate, ratio_estimate, rotated
from studylib.decoding import ar
from studylib.models import load_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama", required=True, help="llamacpp_peer.py's JSON")
    p.add_argument("--prompts", default="reports/cpu/peers/ch08_prompts.jsonl")
    p.add_argument("--acts", default="fp32,int8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats per prompt (their median is kept)")
    p.add_argument("--out", default="reports/bench/decode_vs_llamacpp.json")
    a = p.parse_args()
    peer = json.loads(Path(a.llama).read_text())
    if why := other_machine(peer, a.threads, "this run"):
        raise SystemExit(f"{a.llama} cannot stand beside this run: {why}; rerun llamacpp_peer.py here with "
                         f"--threads {a.threads} (peers compare on one machine only).")
    theirs = {r["id"]: r for r in peer["prompts"]}
    prompts = [json.loads(line) for line in Path(a.prompts).read_text().splitlines() if line.strip()]
    prompts = [r for r in prompts if r["id"] in theirs]
    torch.set_num_threads(a.threads)
    acts = a.acts.split(",")
    models = {act: load_model("smollm2-135m", weights="gguf", act=act)[0] for act in acts}
    for m in models.values():
        ar.generate(m, prompts[0]["prompt_token_ids"], 8)  # warm-up
    rate: dict[str, dict[int, list[float]]] = {act: {} for act in acts}
    toks: dict[str, dict[int, list[int]]] = {act: {} for act in acts}
    for k in range(a.repeats):
        for i, r in enumerate(prompts):
            for act in rotated(acts, k + i):
                res = ar.generate(models[act], r["prompt_token_ids"], r["max_new_tokens"])
                rate[act].setdefault(r["id"], []).append((res.new_tokens - 1) / max(res.wall_s - res.ttft_s, 1e-9))
                toks[act][r["id"]] = res.token_ids
    ids = [r["id"] for r in prompts]
    llama_rate = [1 / theirs[i]["decode_s_per_token"] for i in ids]
    out = {"cpu": cpu_model(), "threads": a.threads, "prompts": len(ids), "repeats": a.repeats,
           "llama_cpp": {"system_info": peer.get("system_info"), "version": peer.get("llama_cpp_python"),
                         "decode_tok_s": estimate(llama_rate).to_dict()},
           "arms": {}, "provenance": provenance(model="smollm2-135m", weights="gguf", acts=acts, threads=a.threads)}
    for act in acts:
        ours = [sorted(rate[act][i])[len(rate[act][i]) // 2] for i in ids]
        agree = sum(toks[act][i][:len(theirs[i]["tokens"])] == theirs[i]["tokens"] for i in ids)
        out["arms"][act] = {
            "decode_tok_s": estimate(ours).to_dict(),
            # tokens/s ratio ours / llama.cpp = llama.cpp's seconds per token over ours, paired per prompt
            "vs_llama_cpp": ratio_estimate([1 / x for x in llama_rate], [1 / x for x in ours]).to_dict(),
            "greedy_identical_to_llama_cpp": agree,
        }
        e = out["arms"][act]["vs_llama_cpp"]
        print(f"--act {act}: {out['arms'][act]['decode_tok_s']['value']:.1f} tok/s, {e['value']:.2f}x llama.cpp "
              f"[{e['ci_low']:.2f}, {e['ci_high']:.2f}] (n={e['n']}); greedy identical to llama.cpp {agree}/{len(ids)}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
