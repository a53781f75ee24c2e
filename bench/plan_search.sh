#!/usr/bin/env bash
# pipeflow plan's search on a 1T model and 3072 devices, with one and with two partition methods, each bounded
# against exhaustive (bench/plan_search.cc); BASELINE=0 skips the exhaustive searches.
set -euo pipefail
source "$(dirname "$0")/common.sh"
need "$build_dir/bench/bench_plan_search"
load
if [ "${BASELINE:-1}" = 0 ]; then "$build_dir/bench/bench_plan_search" --no-baseline; else "$build_dir/bench/bench_plan_search"; fi
load
