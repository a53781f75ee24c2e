#!/usr/bin/env bash
# The pipeline runtime against its own baseline (bench/runtime_pipeline.cc):
# 2 stages on 2 cores vs 1 stage on 1 core on the same global batch, per step
# as a fraction of the ideal 2 x (1 - predicted bubble), on two models: the
# small one of examples/train_1f1b_2stage_small.json and make run's
# (examples/train_1f1b_2stage.json); the 1-stage run also on the second core,
# and the ratio against the two cores' combined rate (this machine's cores
# are not always equal). The load average is printed around each:
# with other work on the cores the pipelined run cannot get its two cores
# and the ratios say so.
# Usage: bench/runtime_pipeline.sh [build-dir]   (STEPS=... to change)
set -euo pipefail
source "$(dirname "$0")/common.sh"
bench="$build_dir/bench/bench_runtime_pipeline"
need "$bench"
load
"$bench" --layers 4 --width 64 --heads 4 --context 32 --micro-batch 4 --microbatches 8 --steps "${STEPS:-20}"
load
"$bench" --steps "${STEPS:-20}"
load
