#!/usr/bin/env bash
# Runs every libFuzzer target of fuzz/ for a bounded time on its committed seed
# corpus (fuzz/corpus/<target>/, read only: new inputs go to a temporary
# folder). A crash, a sanitizer report, an exception other than
# pipeflow::Error, more than 1 GiB of memory or an input that takes over 10 s
# fails the run; the input is saved as build/fuzz/crash-<target>-* to become
# a regression test.
# Usage: tools/fuzz.sh [build-dir] [seconds per target]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build/fuzz}
seconds=${2:-${FUZZ_SECONDS:-20}}
status=0
for corpus in fuzz/corpus/*/; do
  target=$(basename "$corpus")
  binary="$build_dir/fuzz/${target}_fuzz"
  [ -x "$binary" ] || { echo "missing $binary: build with the fuzz preset first" >&2; exit 1; }
  scratch=$(mktemp -d)
  echo "fuzz: $target for ${seconds}s"
  if ! "$binary" -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len=262144 \
      -artifact_prefix="$build_dir/crash-$target-" -print_final_stats=1 "$scratch" "$corpus" \
      >"$build_dir/$target.log" 2>&1; then
    echo "fuzz: $target FAILED (log: $build_dir/$target.log)"
    tail -n 30 "$build_dir/$target.log"
    status=1
  else
    grep -E "stat::number_of_executed_units" "$build_dir/$target.log" || true
  fi
  rm -rf "$scratch"
done
exit $status
