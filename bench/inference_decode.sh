#!/usr/bin/env bash
# Inference against its own baselines (bench/inference_decode.cc): decode
# tokens/s with 2 stages on 2 threads and 2 groups of sequences against 1
# stage on 1 thread, the same prompts, alternately; then one new token with
# the KV cache against recomputing the prefix at 32, 128 and the full context.
# Then the same at 8, 32 and 64 sequences (a group's rows are what a decode
# product multiplies each weight by). Then what bounds the ratio: the work of
# cutting the sequences into 2 groups on one thread; what two cores give, two
# single-thread copies at once (each pinned to its core) against one alone;
# both stages on one core, core 0 then core 1 (the 1-stage baseline runs on
# core 0 and stage 1 on core 1: where the cores differ in speed, the
# free-core ratio of the 2-core runs holds that difference too);
# and the pipelined decode of the smallest and the largest model measured
# (hand-offs against weight traffic).
# The load average is printed around each: with other work on the cores the
# pipelined run cannot get its two cores and the ratio says so.
# Usage: bench/inference_decode.sh [build-dir]   (ROUNDS=... to change)
set -euo pipefail
source "$(dirname "$0")/common.sh"
bench="$build_dir/bench/bench_inference_decode"
need "$bench"
load
"$bench" --rounds "${ROUNDS:-7}"
load
echo "== by batch: 8, 32 and 64 sequences (groups of 4, 16 and 32 rows)"
for sequences in 8 32 64; do
  "$bench" --rounds 5 --sequences "$sequences" --repeats 0 | grep -E "^decode|groups?:|x;|decode alone|CPU time"
  load
done
echo "== grouping alone: 2 groups of 8 on one thread against 1 group of 16"
"$bench" --rounds 3 --stages 1 --microbatches 2 --repeats 0 | grep -E "median|rounds"
load
echo "== two cores: the unpipelined run alone, then two copies at once (cores 0 and 1)"
taskset -c 0 "$bench" --rounds 3 --stages 1 --microbatches 1 --repeats 0 | grep "1 stage, 1 group"
taskset -c 0 "$bench" --rounds 3 --stages 1 --microbatches 1 --repeats 0 | grep "1 stage, 1 group" | sed 's/^/  core 0 beside core 1:/' &
taskset -c 1 "$bench" --rounds 3 --stages 1 --microbatches 1 --repeats 0 | grep "1 stage, 1 group" | sed 's/^/  core 1 beside core 0:/'
wait
load
echo "== one core for both stages: core 0, then core 1, at 8, 16 and 32 rows a group (their CPU time: a core's"
echo "   speed against the other's, and the free-core ratio on identical cores: what the decode's work sets)"
for core in 0 1; do
  for sequences in 16 32 64; do
    taskset -c "$core" "$bench" --rounds 3 --sequences "$sequences" --repeats 0 | grep "CPU time per token step" |
      sed "s/^ */  core $core, $sequences sequences: /"
  done
done
load
echo "== smallest: 4 layers, width 128, 4 sequences"
"$bench" --rounds 5 --layers 4 --width 128 --heads 4 --sequences 4 --repeats 0
load
echo "== largest: 8 layers, width 1024, 64 sequences (2 groups of 32)"
"$bench" --rounds 3 --width 1024 --heads 16 --sequences 64 --new-tokens 16 --context 64 --repeats 0
load
