#!/usr/bin/env bash
# The decode product (tensor/panels.h) against pipeflow::gemm (oneDNN's sgemm) in the same
# run, from 4 to 256 rows, on weights beyond the caches and within them, in
# 4 KiB pages and in huge pages (bench/panels_product.cc).
# Usage: bench/panels_product.sh [build-dir]
set -euo pipefail
source "$(dirname "$0")/common.sh"
bench="$build_dir/bench/bench_panels_product"
need "$bench"
load
"$bench"
load
