#!/usr/bin/env bash
# Runs every benchmark script bench/*.sh in name order. Each script takes the
# build directory and prints its ratios; docs/PERFORMANCE.md records them.
set -euo pipefail
build_dir=${1:-build/release}
cd "$(dirname "$0")/.."
status=0
for script in bench/*.sh; do
  [ "$script" = bench/run_all.sh ] && continue
  echo "== $script"
  bash "$script" "$build_dir" || status=1
done
exit $status
