#!/usr/bin/env bash
# Many replies at once on a GPU, in one prepared run (issue 41, item 4):
#
#   OUT=/tmp/gpu-replies bash bench/gpu_replies.sh
#
# On a CUDA host with this checkout installed as the README says, plus onnxruntime-gpu
# swapped in for onnxruntime (docs/export.md, "On a GPU host"): builds the fp16 reply
# model with its batched graph (16 replies a pass, plain attention), then runs
# `quicksilver bench replies --device cuda` at 1, 8, 32 and 128 replies at once, batched
# and one reply per pass, and writes $OUT/replies-gpu.json (tokens/s and first sentence
# p50/p95 per level) beside the machine's GPU. Each step has a timeout; the whole run
# stays under 10 minutes. It has not run yet: no GPU host has been lent since it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-replies}
PY=${PY:-.venv/bin/python}
QS=${QS:-.venv/bin/quicksilver}
CACHE=${CACHE:-$OUT/cache}
mkdir -p "$OUT" "$CACHE"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt"
"$PY" -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())' >>"$OUT/gpu.txt"
grep -q CUDAExecutionProvider "$OUT/gpu.txt" || { echo "onnxruntime-gpu is not installed" >&2; exit 1; }

timeout 360 "$QS" export --fp16 --batch-rows 16 --no-check --adapter model/adapters-tools \
  --cache-dir "$CACHE" >"$OUT/export.log" 2>&1
timeout 220 "$QS" bench replies --device cuda --cache-dir "$CACHE" --levels 1 8 32 128 \
  --replies 64 --json "$OUT/replies-gpu.json" | tee "$OUT/replies-gpu.txt"
