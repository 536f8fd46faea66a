"""vLLM CPU's time to first token on exported prompts: the prefill peer of ``benchmarks/prefill_vs_vllm.py``.

Runs in vLLM's own venv (README.md here). Each prompt is served alone (prefix caching off), one output
token, ``--repeats`` times; the wall time of ``LLM.generate`` is that request's time to first token.

    .venv-vllm/bin/python benchmarks/peers/vllm_prefill.py --model "$MODEL_DIR" \\
        --prompts /tmp/prefill_prompts.jsonl --out /tmp/vllm_prefill_bf16.json --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from vllm_cpu import cpu_model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    rows = [json.loads(line) for line in a.prompts.read_text().splitlines() if line.strip()]
    if not rows:
        sys.exit(f"{a.prompts} holds no prompts.")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{a.threads - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    longest = max(len(r["prompt_token_ids"]) for r in rows) + 8
    llm = LLM(model=a.model, dtype=a.dtype, max_model_len=max(longest, 256), max_num_seqs=1,
              max_num_batched_tokens=max(longest, 512), enable_prefix_caching=False, seed=0)
    one = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([TokensPrompt(prompt_token_ids=rows[0]["prompt_token_ids"])], one, use_tqdm=False)  # warm-up
    out = []
    for r in rows:
        secs = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=r["prompt_token_ids"])], one, use_tqdm=False)
            secs.append(time.perf_counter() - t0)
        out.append({"id": r["id"], "tokens": len(r["prompt_token_ids"]), "ttft_s": sorted(secs)[len(secs) // 2]})
    res = {"peer": "vLLM CPU", "vllm_version": vllm.__version__, "dtype": a.dtype, "threads": a.threads,
           "cpu": cpu_model(), "repeats": a.repeats, "prompts": out}
    a.out.write_text(json.dumps(res, indent=1))
    med = sorted(r["ttft_s"] for r in out)[len(out) // 2]
    print(f"vLLM {vllm.__version__} {a.dtype}: median TTFT {med:.3f} s over {len(out)} prompts -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
