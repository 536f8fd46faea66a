"""The serving engine's own time per step at 64 rows: what scheduling, block bookkeeping and commits cost
beside the batched forward (the engine issue's aim: under 10% of the step).

Each whole run is a fresh process that loads the engine (``--weights gguf --act int8``, continuous batching with
the radix prefix cache, up to 64 running, KV room for all of them), serves 64 chat requests all at once (54 distinct prompts, the first
10 twice, 48 new tokens each, EOS ignored so every request runs its full length) and reads
``ServingRun.host_time(64)``: host seconds over host + forward seconds in the steps that carried at least 64
sequences, and the median host seconds per step. It repeats with prompt-lookup speculation inside the batch.
The host share's CI is over the runs (``bench.stats.run_estimate``).

    python benchmarks/serving_host_time.py [--runs 5] [--rows 64] [--out reports/bench/serving_host_time.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# KV room for every request at once (64 x ~150 tokens x 46 KB a token is ~440 MiB; the engine's default
# 256 MiB would hold about 40 of them and leave few steps at 64 rows)
KV_BUDGET_MIB = 1024
ARMS = {"continuous+radix": None, "continuous+radix+prompt-lookup": "prompt-lookup:4,3"}


def one_run(rows: int, new_tokens: int) -> dict:
    import torch

    from studylib.data import load_workload
    from studylib.models import load_model
    from studylib.serving.engine import Engine, EngineConfig
    from studylib.serving.request import Request

    torch.set_num_threads(2)
    lm, tok = load_model("smollm2-135m", "cpu", "float32", weights="gguf", act="int8")
    chat = load_workload("chat")
    records = (list(chat) * (rows // len(chat) + 1))[:rows]
    prompts = [[int(t) for t in tok.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False)] for r in records]
    out = {}
    for arm, spec in ARMS.items():
        eng = Engine(lm, EngineConfig(scheduler="continuous", prefix_cache="radix", max_running=rows,
                                      max_batch_tokens=2048, kv_budget_mib=KV_BUDGET_MIB, speculate=spec), tok)
        run = eng.run([Request(f"r{i}", p, new_tokens, ignore_eos=True) for i, p in enumerate(prompts)])
        out[arm] = run.host_time(rows)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--out", default="reports/bench/serving_host_time.json")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single run, JSON to stdout
    args = p.parse_args(argv)
    if args.runs < 2 or args.rows < 1:
        print("serving_host_time: --runs needs >= 2 (a CI over whole runs) and --rows >= 1", file=sys.stderr)
        return 2
    if args.one:
        print(json.dumps(one_run(args.rows, args.new_tokens)))
        return 0

    from tqdm import tqdm

    from studylib.bench.provenance import provenance
    from studylib.bench.stats import run_estimate

    runs = []
    for _ in tqdm(range(args.runs), desc="whole runs"):
        done = subprocess.run([sys.executable, __file__, "--one", "--rows", str(args.rows), "--new-tokens",
                               str(args.new_tokens)], capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    summary = {}
    for arm in ARMS:
        shares = [r[arm]["host_share"] for r in runs if r[arm]["host_share"]]
        e = run_estimate(shares) if len(shares) >= 2 else None
        summary[arm] = {"host_share": e.to_dict() if e else None,
                        "host_s_per_step_p50": [r[arm]["host_s_per_step_p50"] for r in runs],
                        "steps_with_rows": [r[arm]["host_steps"] for r in runs]}
        if e:
            print(f"{arm}: host share at >= {args.rows} rows {e.value:.4f} [{e.ci_low:.4f}, {e.ci_high:.4f}] over "
                  f"{e.n} whole runs (aim < 0.10)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": args.rows, "new_tokens": args.new_tokens, "runs": runs, "summary": summary,
                               "provenance": provenance(rows=args.rows, runs=args.runs, new_tokens=args.new_tokens)}, indent=1,
                              default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
