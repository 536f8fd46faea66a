"""A prefill through the fused int8 step under the shipped AMX rule against the tiles forced on every weight,
interleaved in one process: what the rule's weight-size half costs at prefill sizes.

The rule (``int8_linear.c``: tiles from 16 rows on weights of 2 Mi entries or more) keeps the embedded model's
576-wide layers on AVX512-VNNI, which is right for decode-sized steps; at hundreds of rows the 2 x 2 tile kernel
may win even there. Both arms compute the same bits (the integer sums are exact; the tests check it), so only
the time differs. Needs a CPU with AMX-INT8.

    python benchmarks/prefill_tiles.py [--tokens 500] [--repeats 8] [--model smollm2-135m] [--weights gguf]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=500)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--weights", default="gguf")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if args.tokens < 16 or args.repeats < 3 or args.threads < 1:
        print("prefill_tiles: --tokens must be >= 16, --repeats >= 3 and --threads >= 1", file=sys.stderr)
        return 2
    import torch

    from studylib.attention import make_cache
    from studylib.models import int8_linear as I
    from studylib.models import load_model

    if "amx" not in I.available():
        print("prefill_tiles: this CPU has no AMX-INT8 (amx_int8 in /proc/cpuinfo); run it on one that has",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    model, _ = load_model(args.model, "cpu", "float32", weights=args.weights, act="int8")
    if model.config.max_position_embeddings < args.tokens + 8:
        print(f"prefill_tiles: --tokens {args.tokens} exceeds the model's window; lower it", file=sys.stderr)
        return 2
    ids = (torch.arange(args.tokens) * 7919 % (model.config.vocab_size - 10) + 10)[None]
    rule = I.amx_min_rows()
    times: dict[str, list[float]] = {"shipped rule": [], "tiles forced": []}
    for r in range(args.repeats + 1):  # the first round warms both arms and is dropped
        arms = list(times) if r % 2 == 0 else list(times)[::-1]
        for arm in arms:
            old = I.amx_min_rows(1 if arm == "tiles forced" else rule)
            cache = make_cache("dense", model.config, args.tokens + 8, model.device, model.dtype)
            t0 = time.perf_counter()
            model(ids, cache.begin(args.tokens), logits="last")
            if r:
                times[arm].append(time.perf_counter() - t0)
            I.amx_min_rows(old)
    print(f"{args.model} --weights {args.weights} --act int8, prefill of {args.tokens} tokens, {args.repeats} "
          f"interleaved repeats, {args.threads} threads; rule: {I.amx_rule()}")
    base = statistics.median(times["shipped rule"])
    for arm, ts in times.items():
        med = statistics.median(ts)
        print(f"{arm:>13}: median {med * 1e3:.1f} ms (min {min(ts) * 1e3:.1f}), {base / med:.3f}x the shipped rule")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
