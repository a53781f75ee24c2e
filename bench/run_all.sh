#!/usr/bin/env bash
# Runs every benchmark script bench/*.sh in name order. Each script takes the
# build directory and prints its ratios; docs/PERFORMANCE.md records them.
set -euo pipefail
source "$(dirname "$0")/common.sh"
status=0
for script in bench/*.sh; do
  case "$script" in bench/run_all.sh | bench/common.sh) continue ;; esac
  echo "== $script"
  bash "$script" "$build_dir" || status=1
done
exit $status
