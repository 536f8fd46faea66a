"""``studylib bench ar``: the side-by-side decode benchmark (ours against HF transformers)."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("which", choices=["ar", "probe", "steps"],
                   help="ar: studylib vs HF generate vs roofline; probe: machine limits; steps: the cost of one "
                        "step against the rows in it, v(k), and the ridge point")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: bfloat16 for dense weights, "
                   "float32 for block formats)")
    p.add_argument("--weights", default="dense", help="dense | gguf | q8_0 | q4_0 | q4_1 | awq4")
    p.add_argument("--act", default="fp32", help="fp32 (default: the exact model) | int8 (x rounded to int8 per 32-block, integer dot products) | bf16 (x rounded to bf16, bf16 dot products); int8 and bf16 need block-format --weights")
    p.add_argument("--rows", default="1,2,4,8,16,32,64", help="steps: row counts, comma-separated")
    p.add_argument("--context", type=int, default=256, help="steps: tokens already in the cache")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts", type=int, default=4, help="number of chat prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default: ar 2, steps 10)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="reports/bench", help="directory for the JSON result")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from studylib.models import resolve_device

    resolve_device(args.device)
    if args.which == "probe":
        from studylib.bench.roofline import machine_probe

        print(json.dumps(machine_probe(args.device, args.threads), indent=2))
        return 0
    if args.which == "steps":
        from studylib.bench.steps import parse_rows, run_steps
        from studylib.bench.steps import summary_lines as step_lines

        result = run_steps(args.model, args.weights, args.act, parse_rows(args.rows), args.context,
                           args.repeats or 10, args.threads, args.out)
        print(json.dumps(result) if args.json else "\n".join(step_lines(result)))
        return 0
    from studylib.bench.ar_bench import run_ar_bench, summary_lines

    dtype = args.dtype or ("bfloat16" if args.weights == "dense" else "float32")
    result = run_ar_bench(args.model, dtype, args.prompts, args.max_new_tokens, args.repeats or 2,
                          args.threads, args.device, args.out, weights=args.weights, act=args.act)
    print(json.dumps(result) if args.json else "\n".join(summary_lines(result)))
    return 0
