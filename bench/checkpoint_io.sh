#!/usr/bin/env bash
# Checkpoints, saved models and evaluations' gathered models in and out of
# safetensors bytes (bench/checkpoint_io.cc) against memcpy of the same bytes
# in the same run; then what `pipeflow train` of make run's model pays for an
# evaluation and a checkpoint after every step, against the same run with
# neither (wall-clock seconds, the extra per evaluation or checkpoint).
# Usage: bench/checkpoint_io.sh [build-dir]   (STEPS=... to change, default 30)
set -euo pipefail
source "$(dirname "$0")/common.sh"
bench="$build_dir/bench/bench_checkpoint_io"
pipeflow="$build_dir/pipeflow"
need "$bench"
need "$pipeflow"
steps=${STEPS:-30}
if ! [[ $steps =~ ^[0-9]+$ ]] || ((steps < 2)); then
  echo "STEPS=$steps: must be a whole number of at least 2 (the last step evaluates in every run, so one step leaves no evaluation to count): try STEPS=30" >&2
  exit 2
fi
load
"$bench"
load
runs=$(mktemp -d /tmp/pipeflow-bench-checkpoint-XXXXXX)
trap 'rm -rf "$runs"' EXIT
python3 - "$runs" <<'PY'
import json, sys
base = json.load(open("examples/train_1f1b_2stage.json"))
for name, extra in [("neither", {"eval_interval": 0}), ("evaluation", {"eval_interval": 1}),
                    ("checkpoint", {"eval_interval": 0, "checkpoint": {"interval": 1, "keep": 2}})]:
    json.dump({**base, **extra}, open(f"{sys.argv[1]}/{name}.json", "w"))
PY
declare -A seconds
for name in neither evaluation checkpoint; do
  start=$EPOCHREALTIME
  train "$runs/$name.json" "$name" ""
  seconds[$name]=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }')
done
awk -v s="$steps" -v n="${seconds[neither]}" -v e="${seconds[evaluation]}" -v c="${seconds[checkpoint]}" 'BEGIN {
  printf "pipeflow train, make run'"'"'s model, %d steps: %.2f s with neither, %.2f s evaluating after every step, %.2f s checkpointing after every step\n", s, n, e, c
  printf "an evaluation: %.1f ms (of %d; the last step evaluates in every run), a checkpoint: %.1f ms, a step: %.1f ms\n", (e - n) / (s - 1) * 1000, s - 1, (c - n) / s * 1000, n / s * 1000
}'
load
