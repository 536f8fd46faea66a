"""``studylib bench-serve``: replay a workload against the serving engine and report vLLM-style metrics.

    studylib bench-serve --model smollm2-135m --workload chat --scheduler continuous \
        --prefix-cache radix --rate 4 --num-requests 32 --json

``--scheduler sequential --prefix-cache radix`` is also how chapter 4 takes single-stream TTFT numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rate must be a number of requests/s or 'inf', got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--rate must be > 0 (inf = all requests at t=0), got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="model name, path or HF id (default: smollm2-135m)")
    p.add_argument("--workload", default="chat",
                   help="a data set (chat, chat:<category>, xsum, narrativeqa, humaneval), 'synthetic' "
                        "(random token ids), or a JSONL file (id, prompt|messages, max_new_tokens, arrival_s)")
    p.add_argument("--scheduler", default="continuous", choices=["sequential", "static", "continuous"])
    p.add_argument("--prefix-cache", default="none", choices=["none", "radix"])
    p.add_argument("--rate", type=_rate, default=math.inf,
                   help="mean arrival rate in requests/s (default inf: all at t=0, i.e. saturation)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1 = Poisson)")
    p.add_argument("--num-requests", type=int, default=None,
                   help="requests to serve (default: every request of a JSONL file, 16 otherwise; "
                        "with a file, the first N)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="cap on every request's output")
    p.add_argument("--ignore-eos", action="store_true", help="always generate max_new_tokens (vLLM's option)")
    p.add_argument("--seed", type=int, default=0, help="seeds the workload sample and the arrivals")
    p.add_argument("--max-batch-tokens", type=int, default=512)
    p.add_argument("--max-running", type=int, default=32, help="requests in flight (static: batch size)")
    p.add_argument("--chunk-size", type=int, default=None, help="longest prefill chunk (default: batch tokens)")
    p.add_argument("--cache-aware", action="store_true", help="admit the longest cached prefix first")
    p.add_argument("--max-bypass", type=int, default=16,
                   help="--cache-aware: a request jumped over this many times is admitted next (default 16)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-budget-mib", type=float, default=256.0)
    p.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=None,
                   help="bit-exact vs. single-request decoding; default: on where the invariant C kernels "
                        "apply (fp32 dense weights on CPU), off elsewhere (forcing it there runs the slow "
                        "row-by-row reference)")
    p.add_argument("--slo-ttft", type=float, default=None, help="goodput SLO on TTFT (s)")
    p.add_argument("--slo-tpot", type=float, default=None, help="goodput SLO on TPOT (s)")
    p.add_argument("--slo-e2el", type=float, default=None, help="goodput SLO on end-to-end latency (s)")
    p.add_argument("--dtype", default=None, help="float32 (CPU default) | bfloat16 | float16 (CUDA only)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--weights", default="dense", help="dense | gguf | q8_0 | q4_0 | q4_1 | awq4 (CPU, fp32)")
    p.add_argument("--act", default="fp32", help="fp32 (default: the exact model) | int8 (x rounded to int8 per 32-block, integer dot products) | bf16 (x rounded to bf16, bf16 dot products); int8 and bf16 need block-format --weights")
    p.add_argument("--records", default=None, help="write one JSONL line per request to this file")
    p.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print one JSON summary object")


def run(args: argparse.Namespace) -> int:
    from studylib.errors import StudylibError
    from studylib.models import load_model
    from studylib.serving.engine import Engine, EngineConfig
    from studylib.serving.workload import make_workload, to_requests

    if args.num_requests is not None and args.num_requests < 1:
        raise StudylibError(f"--num-requests must be >= 1, got {args.num_requests}.")
    if args.max_new_tokens < 1:
        raise StudylibError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}.")
    if args.batch_invariant and args.weights != "dense" and args.act == "fp32":
        # The invariant mode swaps the dense linears and attention for batch-invariant ones; block
        # weights with fp32 activations have their own arithmetic, not covered by that guarantee (int8
        # or bf16 activations are: their linears are row-invariant by construction, see models.int8_linear).
        raise StudylibError(f"--batch-invariant covers --weights dense, or block weights with --act int8 or bf16; "
                            f"drop --batch-invariant or add --act int8 to --weights {args.weights}.")
    slo = {k: v for k, v in (("ttft_s", args.slo_ttft), ("tpot_s", args.slo_tpot), ("e2el_s", args.slo_e2el))
           if v is not None}
    config = EngineConfig(
        scheduler=args.scheduler, prefix_cache=args.prefix_cache, max_batch_tokens=args.max_batch_tokens,
        max_running=args.max_running, chunk_size=args.chunk_size, cache_aware=args.cache_aware,
        max_bypass=args.max_bypass, block_size=args.block_size, kv_budget_mib=args.kv_budget_mib,
        batch_invariant=args.batch_invariant)
    model, tok = load_model(args.model, args.device, args.dtype, weights=args.weights, act=args.act)
    items = make_workload(args.workload, args.num_requests, args.seed, args.max_new_tokens, tok)
    requests = to_requests(items, tok, rate=args.rate, burstiness=args.burstiness, seed=args.seed,
                           max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos)
    engine = Engine(model, config, tok)
    refusals = []
    for req in requests:
        try:
            engine.check(req)
        except StudylibError as err:
            refusals.append(str(err))
    if refusals and len(refusals) == len(requests):
        raise StudylibError(f"every one of the {len(requests)} requests would be rejected, so nothing was "
                            f"measured; the first: {refusals[0]}")
    result = engine.run(requests, progress=args.progress)
    summary = result.summary(slo)
    summary.update(model=model.config.name, random_weights=model.config.random_weights,
                   weights=args.weights, act=args.act,
                   scheduler=args.scheduler, prefix_cache=args.prefix_cache,
                   rate=args.rate if math.isfinite(args.rate) else "inf",
                   workload=args.workload)
    if args.records:
        from pathlib import Path

        Path(args.records).parent.mkdir(parents=True, exist_ok=True)
        Path(args.records).write_text("".join(json.dumps(r) + "\n" for r in result.records()), encoding="utf-8")
    for r in requests:
        if r.stop_reason == "rejected":
            print(f"studylib: warning: {r.error}", file=sys.stderr)
    if not summary["requests"]:
        reasons = sorted({str(r.stop_reason) for r in requests})
        print(f"studylib: error: none of the {len(requests)} requests completed (stop reasons: "
              f"{', '.join(reasons)}), so there is nothing to report.", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    else:
        d = summary
        print(f"{args.scheduler} / prefix {args.prefix_cache} / rate {args.rate:g} req/s on {model.config.name}: "
              f"{d['requests']} requests, {d['output_tokens']} tokens in {d['duration_s']:.2f} s")
        print(f"  throughput {d['throughput_tok_s']:.1f} tok/s, {d['requests_per_s']:.2f} req/s; "
              f"prefix hit rate {d['prefix_hit_rate']:.1%}"
              + (f"; most bypasses {d['max_bypassed']} (bound {args.max_bypass})" if args.cache_aware else ""))
        for key in ("ttft_s", "tpot_s", "itl_s", "e2el_s"):
            v = d[key]
            if v["mean"] is not None:
                print(f"  {key[:-2]:>5}: mean {v['mean'] * 1e3:.1f} ms  p50 {v['p50'] * 1e3:.1f}  "
                      f"p90 {v['p90'] * 1e3:.1f}  p99 {v['p99'] * 1e3:.1f}")
    return 0
