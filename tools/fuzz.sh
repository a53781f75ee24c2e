#!/usr/bin/env bash
# Runs every libFuzzer target of fuzz/ for a bounded number of inputs on its
# committed seed corpus (fuzz/corpus/<target>/, read only: new inputs go to a
# temporary folder), from a fixed seed, so that a run explores the same inputs
# every time (CI checks what was checked here; a longer search is
# `tools/fuzz.sh build/asan 1000000`, with any seed). A crash, a sanitizer report, an exception other than
# pipeflow::Error, more than 1 GiB of memory or an input that takes over 10 s
# fails the run; the input is saved as build/asan/crash-<target>-* to become
# a regression test.
# Usage: tools/fuzz.sh [build-dir] [inputs per target] [seed]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build/asan}
runs=${2:-${FUZZ_RUNS:-30000}}
seed=${3:-1}
status=0
# trace_analysis simulates and re-simulates every trace it reads (about 300
# inputs a second under ASan, a tenth of the others' pace): it takes a third
# of the inputs, so that no target holds CI up.
declare -A share=([trace_analysis]=3)
for corpus in fuzz/corpus/*/; do
  target=$(basename "$corpus")
  binary="$build_dir/fuzz/${target}_fuzz"
  [ -x "$binary" ] || { echo "missing $binary: build with the asan preset first (make fuzz)" >&2; exit 1; }
  scratch=$(mktemp -d)
  # $TMPDIR of the target: what it makes there goes with it; in memory where
  # the machine has /dev/shm (the output-path target's fsyncs cost nothing there).
  work=$(mktemp -d -p "$([ -d /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")")
  target_runs=$((runs / ${share[$target]:-1}))
  echo "fuzz: $target, $target_runs inputs from seed $seed"
  if ! TMPDIR="$work" "$binary" -runs="$target_runs" -seed="$seed" -rss_limit_mb=1024 -timeout=10 -max_len=262144 \
      -artifact_prefix="$build_dir/crash-$target-" -print_final_stats=1 "$scratch" "$corpus" \
      >"$build_dir/$target.log" 2>&1; then
    echo "fuzz: $target FAILED (log: $build_dir/$target.log)"
    tail -n 30 "$build_dir/$target.log"
    status=1
  else
    grep -E "stat::number_of_executed_units" "$build_dir/$target.log" || true
  fi
  rm -rf "$scratch" "$work"
done
exit $status
