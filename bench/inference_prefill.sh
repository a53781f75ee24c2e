#!/usr/bin/env bash
# Pipelined prefill (bench/inference_prefill.cc): the time to first token of
# one 1,024-token prompt on GPT-2 124M's shape (12 layers, width 768, 12
# heads; byte vocabulary) by 2 stages on 2 threads, its chunks flowing
# through the stages, against 1 stage on 1 thread (whole and chunked), the
# same prompt, alternately; chunks of 128 (the default) and of 64.
# The load average is printed around each: with other work on the cores the
# pipelined run cannot get its two cores and the ratio says so.
# Usage: bench/inference_prefill.sh [build-dir]   (ROUNDS=... to change)
set -euo pipefail
source "$(dirname "$0")/common.sh"
bench="$build_dir/bench/bench_inference_prefill"
need "$bench"
load
"$bench" --rounds "${ROUNDS:-5}" --chunk 128
load
"$bench" --rounds "${ROUNDS:-5}" --chunk 64
load
# Linux's autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled)
# shares the cores between sessions, not threads: with other sessions busy,
# the 2 stage threads of one process get one session's share, as 1 stage
# does, and the ratio above stays near 1. Under mpirun each stage is a
# process; started with setsid each is a session of its own, as each stage
# would have its own device. The same prompt and chunks through `pipeflow
# generate`, 1 process against 2, alternately, 3 rounds (the tokens printed
# must agree).
pipeflow="$build_dir/pipeflow"
need "$pipeflow"
if command -v mpirun >/dev/null; then
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  "$pipeflow" init --layers 12 --heads 12 --width 768 --context 1024 --out "$dir/w.safetensors" >/dev/null
  prompt=$(printf 'abcdefghij%.0s' $(seq 102))abcd
  first() {  # first LAUNCHER...: time to first token and the token, from --json
    "$@" "$pipeflow" generate --weights "$dir/w.safetensors" --prompt "$prompt" --max-new-tokens 1 \
      --prefill-chunk 128 --json |
      python3 -c "import json,sys; j=json.load(sys.stdin); print(j['time_to_first_token_s'], j['outputs'][0]['tokens'][0])"
  }
  echo "== under mpirun, a session per process: 1 process against 2, chunks of 128"
  for round in 1 2 3; do
    read -r one one_token < <(first setsid -w)
    read -r two two_token < <(first mpirun --allow-run-as-root -np 2 setsid -w)
    python3 -c "print(f'  round $round: 1 process {$one * 1e3:.0f} ms, 2 processes {$two * 1e3:.0f} ms: ' \
                      f'{$two / $one:.3f}x; tokens {\"equal\" if $one_token == $two_token else \"DIFFERENT\"}')"
  done
  load
fi
