#!/usr/bin/env bash
# The GEMM libraries this machine has (OpenBLAS as pipeflow links it, BLIS,
# oneDNN's sgemm and matmul, oneDNN's bf16 matmul) at pipeflow's training and
# decode shapes, interleaved within each round, beside the core's fp32 peak
# measured in each round (bench/gemm_libraries.cc). One thread each. Needs
# libdnnl-dev and libblis-dev (bench/CMakeLists.txt skips the program
# without them).
# Usage: bench/gemm_libraries.sh [build-dir]   (ROUNDS=5 by default)
set -euo pipefail
source "$(dirname "$0")/common.sh"
bench="$build_dir/bench/bench_gemm_libraries"
if [ ! -x "$bench" ]; then
  echo "skipped: $bench not built (install libdnnl-dev and libblis-dev, then build it)"
  exit 0
fi
load
grep -m1 'model name' /proc/cpuinfo || true
"$bench" --rounds "${ROUNDS:-5}"
load
