"""Mean time of one fused decode step of k rows over a filled cache, repeated many times in one process: the
loop to put under `perf record` (the per-kernel share of a step) or to run once per build when comparing two
versions of a kernel (run it alternately from two checkouts: `PYTHONPATH=<checkout> python ...`).

`studylib bench steps` is the measurement with CIs the chapters quote; this is the profiler's and the A/B's loop.

    python benchmarks/fused_step_time.py [--rows 8] [--context 256] [--steps 300] [--act int8] [--weights gguf]
    perf record -o step.data python benchmarks/fused_step_time.py --rows 8 --steps 1500
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--weights", default="gguf")
    p.add_argument("--act", default="int8", choices=["fp32", "int8", "bf16"])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if args.rows < 1 or args.context < 1 or args.steps < 1 or args.threads < 1:
        print("fused_step_time: --rows, --context, --steps and --threads must be >= 1", file=sys.stderr)
        return 2
    import torch

    from studylib.attention import make_cache
    from studylib.models import decode_layers, load_model

    torch.set_num_threads(args.threads)
    model, _ = load_model(args.model, "cpu", "float32", weights=args.weights, act=args.act)
    if args.context + args.rows > model.config.max_position_embeddings:
        print(f"fused_step_time: --context {args.context} + --rows {args.rows} exceed the model's window; lower one",
              file=sys.stderr)
        return 2
    vocab = model.config.vocab_size
    cache = make_cache("dense", model.config, args.context + args.rows, model.device, model.dtype)
    model((torch.arange(args.context) * 7919 % (vocab - 10) + 10)[None], cache.begin(args.context), logits="none")
    x = (torch.arange(args.rows) * 31 % (vocab - 10) + 10)[None]
    for _ in range(5):  # allocator and first touch
        model(x, cache.begin(args.rows), logits="all")
        cache.truncate(args.context)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        model(x, cache.begin(args.rows), logits="all")
        cache.truncate(args.context)
    ms = (time.perf_counter() - t0) / args.steps * 1e3
    print(f"{args.model} --weights {args.weights} --act {args.act}, {decode_layers.path(model, cache, args.rows)} path: "
          f"{args.rows} rows over {args.context} cached tokens, {ms:.2f} ms a step (mean of {args.steps})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
