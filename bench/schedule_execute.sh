#!/usr/bin/env bash
# The schedule engine on p=64, m=1024, v=2 (bench/schedule_execute.cc).
set -euo pipefail
source "$(dirname "$0")/common.sh"
"$build_dir/bench/bench_schedule_execute"
