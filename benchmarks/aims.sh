#!/usr/bin/env bash
# The engine issue's aims, measured on this machine against the peers (see benchmarks/peers/README.md).
# Needs .venv (make setup), .venv-llama and .venv-vllm. Writes reports/bench/. About 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=reports/bench
mkdir -p "$OUT/steps" "$OUT/peers"
GGUF=$(.venv/bin/python -c 'from studylib.models.hub import smollm2_gguf; print(smollm2_gguf())')
MODEL_DIR=$(.venv/bin/python -c 'from studylib.models import model_dir; print(model_dir("smollm2-135m"))')
PATHS=$(.venv/bin/python -c 'from studylib.models import int8_linear as I; print(" ".join(p for p in I.available() if p != "scalar"))')

# Step cost against rows: every int8 path, and the fp32 arithmetic.
for p in $PATHS; do
  STUDYLIB_INT8_ISA=$p .venv/bin/studylib bench steps --weights gguf --act int8 --repeats 8 --out "$OUT/steps/$p" >/dev/null
  mv "$OUT/steps/$p/steps_gguf_int8.json" "$OUT/steps/steps_gguf_int8_$p.json" && rmdir "$OUT/steps/$p"
done
.venv/bin/studylib bench steps --weights gguf --act fp32 --repeats 8 --out "$OUT/steps" >/dev/null

# Decode against llama.cpp.
.venv-llama/bin/python benchmarks/peers/llamacpp_peer.py --gguf "$GGUF" \
  --prompts reports/cpu/peers/ch08_prompts.jsonl --out "$OUT/peers/llama_cpp_decode.json" --threads 2
.venv/bin/python benchmarks/decode_vs_llamacpp.py --llama "$OUT/peers/llama_cpp_decode.json" --out "$OUT/decode_vs_llamacpp.json"

# Time to first token against vLLM (bf16 and fp32).
.venv/bin/python benchmarks/prefill_vs_vllm.py export --out "$OUT/peers/prefill_prompts.jsonl"
for dt in bfloat16 float32; do
  (cd benchmarks/peers && ../../.venv-vllm/bin/python vllm_prefill.py --model "$MODEL_DIR" \
     --prompts "../../$OUT/peers/prefill_prompts.jsonl" --out "../../$OUT/peers/vllm_prefill_$dt.json" --dtype $dt)
done
.venv/bin/python benchmarks/prefill_vs_vllm.py compare --prompts "$OUT/peers/prefill_prompts.jsonl" \
  --vllm "$OUT/peers/vllm_prefill_bfloat16.json" "$OUT/peers/vllm_prefill_float32.json" --out "$OUT/prefill_vs_vllm.json"

# Serving at saturation against vLLM (bf16 and fp32).
for dt in bfloat16 float32; do
  (cd benchmarks/peers && ../../.venv-vllm/bin/python vllm_cpu.py --model "$MODEL_DIR" --dtype $dt \
     --requests ../../reports/cpu/peers/ch05_requests.jsonl --out "../../$OUT/peers/vllm_serve_$dt.json" \
     --max-num-seqs 64 --max-num-batched-tokens 512 --prefix-caching)
done
.venv/bin/python benchmarks/serve_vs_vllm.py --vllm "$OUT/peers/vllm_serve_bfloat16.json" \
  "$OUT/peers/vllm_serve_float32.json" --out "$OUT/serve_vs_vllm.json"
