#!/usr/bin/env bash
# The schedule engine on p=64, m=1024, v=2 (bench/schedule_execute.cc).
set -euo pipefail
"$1/bench/bench_schedule_execute"
