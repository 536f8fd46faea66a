"""llama.cpp (through llama-cpp-python) as the decode peer of chapter 8, on the very GGUF file and prompts.

Runs in its own virtual environment (see README.md here), never in CI, and imports nothing from
studylib: chapter 8 exports its decode prompts as token ids, with the tokens our ``gguf`` arm produced
(``<out_dir>/peers/ch08_prompts.jsonl``); this script decodes each prompt greedily with llama.cpp on the
same number of threads and writes per-prompt timings and token agreement
(``<out_dir>/peers/llama_cpp.json``), which the chapter shows beside its arms when present.

    .venv-llama/bin/python benchmarks/peers/llamacpp_peer.py --gguf "$(.venv/bin/python -c \
        'from studylib.models.hub import smollm2_gguf; print(smollm2_gguf())')" \
        --prompts reports/cpu/peers/ch08_prompts.jsonl --out reports/cpu/peers/llama_cpp.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name, as the study's provenance reads it: chapter 8 compares only runs on one machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_prompts(path: Path) -> list[dict]:
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows.append({"id": int(row["id"]), "prompt_token_ids": [int(t) for t in row["prompt_token_ids"]],
                         "max_new_tokens": int(row["max_new_tokens"]),
                         "ours": [int(t) for t in row.get("ours", [])]})
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            sys.exit(f"{path}:{lineno}: expected {{id, prompt_token_ids, max_new_tokens}}; rerun chapter 8 to export.")
    if not rows:
        sys.exit(f"{path} holds no prompts.")
    return rows


def decode(llm, ids: list[int], max_new: int, eos: int) -> dict:
    """Greedy decode; times the first token (prefill + one sample) and the rest separately."""
    t0 = time.perf_counter()
    out, stamps = [], []
    for tok in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        stamps.append(time.perf_counter())
        out.append(int(tok))
        if tok == eos or len(out) >= max_new:
            break
    ttft = stamps[0] - t0
    decode_s = (stamps[-1] - stamps[0]) / max(len(out) - 1, 1)
    return {"tokens": out, "ttft_s": ttft, "decode_s_per_token": decode_s, "new_tokens": len(out)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True, help="the GGUF file (chapter 8's gguf arm reads the same one)")
    ap.add_argument("--prompts", required=True, help="chapter 8's export: <out_dir>/peers/ch08_prompts.jsonl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not Path(args.gguf).is_file():
        sys.exit(f"{args.gguf} is not a file; print the path with studylib.models.hub.smollm2_gguf().")
    if not Path(args.prompts).is_file():
        sys.exit(f"{args.prompts} does not exist; run chapter 8 first (it exports the prompts).")
    import llama_cpp

    prompts = read_prompts(Path(args.prompts))
    ctx = max(len(p["prompt_token_ids"]) + p["max_new_tokens"] for p in prompts) + 16
    llm = llama_cpp.Llama(model_path=args.gguf, n_ctx=ctx, n_threads=args.threads, n_threads_batch=args.threads,
                          n_batch=512, verbose=False)
    eos = llm.token_eos()
    decode(llm, prompts[0]["prompt_token_ids"], 8, eos)  # warm-up: first-call allocations
    rows = []
    for p in prompts:
        r = decode(llm, p["prompt_token_ids"], p["max_new_tokens"], eos)
        ours = p["ours"]
        same = sum(1 for a, b in zip(r["tokens"], ours, strict=False) if a == b)
        first_diff = next((i for i, (a, b) in enumerate(zip(r["tokens"], ours, strict=False)) if a != b), None)
        rows.append({"id": p["id"], **r, "identical_to_ours": r["tokens"] == ours,
                     "first_difference": first_diff, "matching_prefix_share": same / max(len(ours), 1)})
    out = {"engine": "llama.cpp", "llama_cpp_python": llama_cpp.__version__, "threads": args.threads,
           "gguf": Path(args.gguf).name, "platform": platform.platform(), "cpu": cpu_model(),
           "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "prompts": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    tps = sorted(1 / r["decode_s_per_token"] for r in rows)
    print(f"llama.cpp: median decode {tps[len(tps) // 2]:.1f} tok/s over {len(rows)} prompts; "
          f"{sum(r['identical_to_ours'] for r in rows)}/{len(rows)} identical to ours -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
