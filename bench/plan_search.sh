#!/usr/bin/env bash
# pipeflow plan's search on a 1T model and 3072 devices, bounded against exhaustive (bench/plan_search.cc).
set -euo pipefail
source "$(dirname "$0")/common.sh"
"$build_dir/bench/bench_plan_search"
