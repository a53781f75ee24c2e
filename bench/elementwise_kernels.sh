#!/usr/bin/env bash
# The kernels between the GEMMs alone (bench_elementwise_kernels), at the
# make-run model's micro-batch (8 × 64 = 512 rows) and the bench model's
# batch (16 × 64 = 1024 rows, arrays past the 1 MiB L2), each against a
# memcpy of the same arrays in the run, hot (the same arrays each call) and
# cold (each call on arrays out of every cache, as in a training step).
# Usage: bench/elementwise_kernels.sh [build-dir]
set -euo pipefail
source "$(dirname "$0")/common.sh"
bench="$build_dir/bench/bench_elementwise_kernels"
need "$bench"
load
for rows in 512 1024; do "$bench" --rows "$rows"; done
load
