#!/usr/bin/env bash
# Inference against its own baselines (bench/inference_decode.cc): decode
# tokens/s with 2 stages on 2 threads and 2 groups of sequences against 1
# stage on 1 thread, the same prompts, alternately; then one new token with
# the KV cache against recomputing the prefix at 32, 128 and the full context.
# The load average is printed around it: with other work on the cores the
# pipelined run cannot get its two cores and the ratio says so.
# Usage: bench/inference_decode.sh [build-dir]   (ROUNDS=... to change)
set -euo pipefail
source "$(dirname "$0")/common.sh"
bench="$build_dir/bench/bench_inference_decode"
need "$bench"
load
"$bench" --rounds "${ROUNDS:-7}"
load
