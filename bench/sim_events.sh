#!/usr/bin/env bash
# Simulated events per second on p=64, m=1024, v=2 (bench/sim_events.cc).
set -euo pipefail
source "$(dirname "$0")/common.sh"
"$build_dir/bench/bench_sim_events"
