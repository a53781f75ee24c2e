#!/usr/bin/env bash
# The pipeline runtime against its own baseline (bench/runtime_pipeline.cc):
# 2 stages on 2 cores vs 1 stage on 1 core on the same global batch, the
# measured bubble beside the predicted one, the runtime's overhead. The load
# average is printed first: with other work on the cores the pipelined run
# cannot get its two cores and the ratios say so.
# Usage: bench/runtime_pipeline.sh [build-dir]   (ROUNDS=..., STEPS=... to change)
set -euo pipefail
build_dir=${1:-build/release}
cd "$(dirname "$0")/.."
bench="$build_dir/bench/bench_runtime_pipeline"
[ -x "$bench" ] || { echo "missing $bench: build first (make build)" >&2; exit 1; }
echo "load before: $(uptime | sed 's/.*load average/load average/')"
"$bench" --rounds "${ROUNDS:-3}" --steps "${STEPS:-12}"
echo "load after: $(uptime | sed 's/.*load average/load average/')"
