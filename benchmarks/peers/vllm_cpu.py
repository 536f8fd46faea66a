"""vLLM's CPU build as a serving peer for chapter 5, on exactly the requests the chapter served.

Runs in its own virtual environment (see README.md here), never in CI, and imports nothing from
studylib: the chapter exports its requests as token ids (``<out_dir>/peers/ch05_requests.jsonl``), this
script serves them all at t = 0 (saturation, vLLM's offline ``LLM.generate``), greedy, and, with ``--rates``,
again at each seeded Poisson arrival rate through vLLM's engine loop (requests added when they arrive,
token times taken as each step returns them, the way our engine measures). It writes a summary the
notebook shows beside our arms (``<out_dir>/peers/vllm_cpu.json``).

The Poisson arrivals are the ones ``studylib.serving.workload.arrival_times(n, rate, 1.0, seed)`` draws
(first request at 0, then numpy ``default_rng(seed).gamma(1, 1 / rate)`` gaps), re-implemented here so
that this script imports nothing from studylib; chapter 5 serves the same requests at the same times.

    .venv-vllm/bin/python benchmarks/peers/vllm_cpu.py --model "$(.venv/bin/python -c \
        'from studylib.models import model_dir; print(model_dir("smollm2-135m"))')" \
        --requests reports/cpu/peers/ch05_requests.jsonl --out reports/cpu/peers/vllm_cpu.json \
        --rates 2,4 --max-num-seqs 64 --prefix-caching
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name, as the study's provenance reads it (this script runs in vLLM's own venv)."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def read_requests(path: Path) -> list[dict]:
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ids, budget = row["prompt_token_ids"], int(row["max_new_tokens"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            sys.exit(f"{path}:{lineno}: expected {{id, prompt_token_ids, max_new_tokens}}; rerun chapter 5 to export.")
        rows.append({"id": str(row.get("id", lineno)), "prompt_token_ids": [int(t) for t in ids],
                     "max_new_tokens": budget})
    if not rows:
        sys.exit(f"{path} holds no requests.")
    return rows


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    import numpy as np

    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"mean": float(np.mean(values)), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    import numpy as np

    gaps = np.random.default_rng(seed).gamma(1.0, 1.0 / rate, size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def serve_online(llm, reqs: list[dict], rate: float, seed: int) -> dict:
    """Serve ``reqs`` arriving as a seeded Poisson process at ``rate`` requests/s through vLLM's engine
    loop; TTFT, TPOT and end-to-end latency per request from the wall clock of this loop. Every request
    produces its full budget (EOS ignored), as chapter 5's runs at these rates do, so both engines do
    the same work whatever their greedy tokens."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    times = arrival_times(len(reqs), rate, seed)
    pending = list(zip(times, reqs, strict=True))
    seen: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    done: dict[str, float] = {}
    t0 = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while pending and pending[0][0] <= now:
            _, r = pending.pop(0)
            engine.add_request(r["id"], TokensPrompt(prompt_token_ids=r["prompt_token_ids"]),
                               SamplingParams(temperature=0.0, max_tokens=r["max_new_tokens"], ignore_eos=True))
            seen[r["id"]], counts[r["id"]] = [], 0
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0][0] - (time.perf_counter() - t0)))
            continue
        outs = engine.step()
        now = time.perf_counter() - t0
        for o in outs:
            n = len(o.outputs[0].token_ids)
            seen[o.request_id] += [now] * (n - counts[o.request_id])
            counts[o.request_id] = n
            if o.finished:
                done[o.request_id] = now
    arrival = {r["id"]: t for t, r in zip(times, reqs, strict=True)}
    ttft = [seen[i][0] - arrival[i] for i in seen if seen[i]]
    tpot = [(seen[i][-1] - seen[i][0]) / (len(seen[i]) - 1) for i in seen if len(seen[i]) > 1]
    e2el = [done[i] - arrival[i] for i in done]
    tokens = sum(counts.values())
    duration = max(done.values()) if done else float("nan")
    return {"rate_req_s": rate, "seed": seed, "requests": len(reqs), "completed": len(done), "output_tokens": tokens,
            "duration_s": duration, "throughput_tok_s": tokens / duration, "ttft_s": percentiles(ttft),
            "tpot_s": percentiles(tpot), "e2el_s": percentiles(e2el)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF-format checkpoint directory (studylib.models.model_dir)")
    p.add_argument("--requests", required=True, type=Path, help="chapter 5's exported ch05_requests.jsonl")
    p.add_argument("--out", required=True, type=Path, help="where to write the JSON summary")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-num-seqs", type=int, default=16, help="like our --max-running")
    p.add_argument("--max-num-batched-tokens", type=int, default=512, help="like our --max-batch-tokens")
    p.add_argument("--prefix-caching", action="store_true", help="enable vLLM's automatic prefix caching")
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="VLLM_CPU_KVCACHE_SPACE equivalent")
    p.add_argument("--rates", default="", help="comma-separated Poisson arrival rates (requests/s) to serve the "
                   "requests at, after the saturation run (e.g. 2,4)")
    p.add_argument("--seed", type=int, default=0, help="seeds the Poisson arrivals (the chapter's seed)")
    p.add_argument("--threads", type=int, default=2,
                   help="OpenMP threads for the model, bound to cores 0..N-1 (the chapter's own thread count)")
    args = p.parse_args()
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        sys.exit(f"--rates must be comma-separated numbers of requests/s, got {args.rates!r}")
    if any(not r > 0 for r in rates):
        sys.exit(f"--rates must be > 0 requests/s, got {args.rates!r}")

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(args.kv_cache_gib))))
    # By default vLLM keeps one core back for its engine process and runs the model on the rest: on a
    # 2-core machine that is one thread against our two. Give it the same cores we use.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    reqs = read_requests(args.requests)
    longest = max(len(r["prompt_token_ids"]) + r["max_new_tokens"] for r in reqs)
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=max(longest, 256),
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=max(args.max_num_batched_tokens, longest),
              enable_prefix_caching=args.prefix_caching, seed=0,
              disable_log_stats=False)  # per-request timings are only kept with stats on
    prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in reqs]
    params = [SamplingParams(temperature=0.0, max_tokens=r["max_new_tokens"]) for r in reqs]
    llm.generate(prompts[:1], params[:1], use_tqdm=False)  # warm-up (graph capture, allocator)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    duration = time.perf_counter() - start

    tokens = [len(o.outputs[0].token_ids) for o in outs]
    ttft, tpot = [], []
    for o, n in zip(outs, tokens, strict=True):
        m = getattr(o, "metrics", None)  # per-request timings, where this vLLM version records them
        if m is not None and getattr(m, "first_token_ts", 0.0):  # V1 engine: RequestStateStats
            ttft.append(m.first_token_latency)
            if n > 1:
                tpot.append((m.last_token_ts - m.first_token_ts) / (n - 1))
            continue
        first, arrival, last = (getattr(m, k, None) for k in ("first_token_time", "arrival_time", "last_token_time"))
        if first is not None and arrival is not None:
            ttft.append(first - arrival)
            if last is not None and n > 1:
                tpot.append((last - first) / (n - 1))
    summary = {
        "peer": "vLLM CPU (offline LLM.generate, all requests at t=0)", "vllm_version": vllm.__version__,
        "cpu": cpu_model(), "cpu_count": os.cpu_count(),  # chapter 5 compares only with a run on this machine
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": args.model, "dtype": args.dtype, "requests": len(reqs), "output_tokens": sum(tokens),
        "duration_s": duration, "throughput_tok_s": sum(tokens) / duration, "requests_per_s": len(reqs) / duration,
        "prefix_caching": args.prefix_caching, "max_num_seqs": args.max_num_seqs, "threads": args.threads,
        "ttft_s": percentiles(ttft), "tpot_s": percentiles(tpot),
        "tpot_p99_s": percentiles(tpot)["p99"],
        "poisson": [serve_online(llm, reqs, rate, args.seed) for rate in rates],
        "token_ids": {r["id"]: list(o.outputs[0].token_ids)
                                                            for r, o in zip(reqs, outs, strict=True)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(f"vLLM {vllm.__version__}: {summary['output_tokens']} tokens in {duration:.2f} s = "
          f"{summary['throughput_tok_s']:.1f} tok/s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
