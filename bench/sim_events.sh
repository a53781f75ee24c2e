#!/usr/bin/env bash
# Simulated events per second on p=64, m=1024, v=2 (bench/sim_events.cc).
set -euo pipefail
"$1/bench/bench_sim_events"
