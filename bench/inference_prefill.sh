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
