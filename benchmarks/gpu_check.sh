#!/usr/bin/env bash
# One prepared run for a CUDA machine (chapter 6): the `gpu` tests, then attention timings of
# torch SDPA (FlashAttention), the Triton kernels and the CUDA kernels at 1k-64k tokens for dense,
# window and sinks, with TFLOP/s against the card's measured matmul peak.
# Writes reports/gpu/{gpu_tests.log,gpu_tests.xml,attention_timing.json,attention_timing.md,SUMMARY.md}.
#
#   bash benchmarks/gpu_check.sh                  # full run (~5-10 min on an H100/H200)
#   TIMING_ARGS="--lengths 1024,4096" bash benchmarks/gpu_check.sh   # quicker
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${GPU_REPORT_DIR:-reports/gpu}

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA GPU is visible to torch on this machine; run this script on a CUDA machine." >&2
  exit 2
fi
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/nvidia_smi.csv" 2>&1 || true

echo "== gpu profile dry run =="
"$PY" -m studylib.cli reproduce --profile gpu --dry-run 2>&1 | tee "$OUT/dry_run.log"
dry_rc=${PIPESTATUS[0]}

echo "== gpu tests =="
"$PY" -m pytest -q -m gpu tests --junitxml "$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}

echo "== attention timing =="
# shellcheck disable=SC2086
"$PY" benchmarks/attention_timing.py --out "$OUT" ${TIMING_ARGS:-}
timing_rc=$?

{
  echo "# GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "- gpu: $(head -2 "$OUT/nvidia_smi.csv" | tail -1)"
  echo "- gpu profile dry run: exit $dry_rc"
  echo "- gpu tests: exit $tests_rc ($(tail -1 "$OUT/gpu_tests.log"))"
  echo "- timing: exit $timing_rc (see attention_timing.md)"
  echo
  [ -f "$OUT/attention_timing.md" ] && cat "$OUT/attention_timing.md"
} > "$OUT/SUMMARY.md"
echo "wrote $OUT/SUMMARY.md"
[ "$dry_rc" -eq 0 ] && [ "$tests_rc" -eq 0 ] && [ "$timing_rc" -eq 0 ]
