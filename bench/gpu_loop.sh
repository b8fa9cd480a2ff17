#!/usr/bin/env bash
# The loop benchmark on a GPU host, in one prepared run (issue 21, "GPU path"):
#
#   OUT=/tmp/gpu-loop bash bench/gpu_loop.sh
#
# On a CUDA host with this checkout installed as the README says, plus onnxruntime-gpu
# swapped in for onnxruntime (docs/export.md, "On a GPU host"): builds the fp16 reply
# model, makes the test speech, starts `quicksilver serve --device cuda` (Whisper base
# float16, Piper and the reply model on the GPU), runs `quicksilver bench loop` twice and
# writes $OUT/loop-gpu.json, the server log and the machine's GPU. Bounded: each step has
# a timeout and the whole run stays under 8 minutes on an H100/H200-class machine.
# It has not run yet: no GPU host has been lent to this project's sessions.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-loop}
PY=${PY:-.venv/bin/python}
QS=${QS:-.venv/bin/quicksilver}
CACHE=${CACHE:-$OUT/cache}
mkdir -p "$OUT" "$CACHE"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt"
"$PY" - <<'EOF' >>"$OUT/gpu.txt"
import ctranslate2, onnxruntime
print("onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers())
print("ctranslate2 cuda devices", ctranslate2.get_cuda_device_count())
EOF
grep -q CUDAExecutionProvider "$OUT/gpu.txt" || { echo "onnxruntime-gpu is not installed" >&2; exit 1; }

# the fp16 graph of base + shipped adapter, into the cache the server reads (first time only)
timeout 240 "$QS" export --fp16 --adapter model/adapters --cache-dir "$CACHE" >"$OUT/export.log" 2>&1 || true
timeout 120 "$PY" -m bench.speechset --out "$OUT/speech" --set all --n 6 >"$OUT/speechset.log" 2>&1

"$QS" serve --device cuda --port 0 --cache-dir "$CACHE" >"$OUT/serve.out" 2>"$OUT/serve.log" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 240); do
  URL=$(grep -o 'ws://[^ ]*' "$OUT/serve.out" || true)
  [ -n "$URL" ] && break
  kill -0 $SERVER 2>/dev/null || { echo "server died: $OUT/serve.log" >&2; exit 1; }
  sleep 0.5
done
[ -n "$URL" ] || { echo "server did not start" >&2; exit 1; }

timeout 300 "$PY" -m bench.loop --url "$URL" --manifest "$OUT/speech/manifest.json" \
  --runs 2 --json "$OUT/loop-gpu.json" | tee "$OUT/loop-gpu.txt"
