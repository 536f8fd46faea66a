"""Serving at saturation on chapter 5's exported requests: our engine (per arithmetic) against vLLM CPU.

vLLM serves the requests in its own venv (``benchmarks/peers/vllm_cpu.py``, once per dtype, on
``reports/<profile>/peers/ch05_requests.jsonl``); this serves the very same token ids, all at t = 0,
greedy, with the same limits (64 running, 512 tokens per step, prefix cache on), ``--repeats`` whole runs
per arm with the arms interleaved, and reports throughput (output tokens / s, median with a bootstrap CI
over repeats), the ratio to vLLM's (a single run each: a point, not a CI), and to our own sequential
serving under the same arithmetic, measured in the same run.

    .venv-vllm/bin/python benchmarks/peers/vllm_cpu.py --model "$MODEL_DIR" --dtype bfloat16 \\
        --requests reports/cpu/peers/ch05_requests.jsonl --out /tmp/vllm_serve_bf16.json \\
        --max-num-seqs 64 --max-num-batched-tokens 512 --prefix-caching
    .venv/bin/python benchmarks/serve_vs_vllm.py --vllm /tmp/vllm_serve_bf16.json --out reports/bench/serve_vs_vllm.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from studylib.bench.provenance import cpu_model, other_machine, provenance
from studylib.bench.stats import estimate, rotated
from studylib.models import load_model
from studylib.serving.check import divergence
from studylib.serving.engine import Engine, EngineConfig
from studylib.serving.request import Request


def requests(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def serve(model, rows: list[dict], scheduler: str) -> tuple[float, list[list[int]]]:
    reqs = [Request(r["id"], r["prompt_token_ids"], r["max_new_tokens"]) for r in rows]
    config = EngineConfig(scheduler=scheduler, prefix_cache="radix" if scheduler == "continuous" else "none",
                          max_batch_tokens=512, max_running=64, kv_budget_mib=1024.0)
    run = Engine(model, config).run(reqs)
    return run.summary()["throughput_tok_s"], [r.output_ids for r in reqs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=Path, default=Path("reports/cpu/peers/ch05_requests.jsonl"))
    p.add_argument("--vllm", type=Path, nargs="*", default=[])
    p.add_argument("--acts", default="fp32,int8")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sequential-share", type=int, default=4,
                   help="sequential serving runs 1/N of the requests per repeat (each request once over N repeats)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("reports/bench/serve_vs_vllm.json"))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    rows = requests(a.requests)
    peers = [json.loads(x.read_text()) for x in a.vllm]
    for x, peer in zip(a.vllm, peers, strict=True):
        if why := other_machine(peer, a.threads, "this run"):
            raise SystemExit(f"{x} cannot stand beside this run: {why}; rerun it here.")
    acts = a.acts.split(",")
    models = {act: load_model("smollm2-135m", weights="gguf", act=act)[0] for act in acts}
    tput = {(act, s): [] for act in acts for s in ("continuous", "sequential")}
    outs = {}
    share = max(1, a.sequential_share)
    for k in range(a.repeats):
        for act in rotated(acts, k):
            t, o = serve(models[act], rows, "continuous")
            tput[(act, "continuous")].append(t)
            outs[act] = o
            part = rows[k % share::share]
            tput[(act, "sequential")].append(serve(models[act], part, "sequential")[0])
    res = {"cpu": cpu_model(), "threads": a.threads, "requests": len(rows), "repeats": a.repeats, "arms": {},
           "provenance": provenance(model="smollm2-135m", weights="gguf", acts=acts, threads=a.threads)}
    for act in acts:
        c, s = estimate(tput[(act, "continuous")]), estimate(tput[(act, "sequential")])
        arm = {"continuous_tok_s": c.to_dict(), "sequential_tok_s": s.to_dict(),
               "continuous_over_sequential": c.value / s.value, "vs_vllm": {}}
        for peer in peers:
            arm["vs_vllm"][f"vLLM {peer['dtype']}"] = {
                "vllm_tok_s": peer["throughput_tok_s"], "ours_over_vllm": c.value / peer["throughput_tok_s"],
                "greedy_identical": divergence(outs[act], [peer["token_ids"][r["id"]] for r in rows])["identical"]}
        res["arms"][act] = arm
        line = (f"--act {act}: continuous {c.value:.0f} tok/s [{c.ci_low:.0f}, {c.ci_high:.0f}] (n={c.n}), "
                f"sequential {s.value:.0f}; ratio {c.value / s.value:.2f}")
        for name, v in arm["vs_vllm"].items():
            line += f"; {name} {v['vllm_tok_s']:.0f} tok/s, ours/vLLM {v['ours_over_vllm']:.2f}"
        print(line)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
