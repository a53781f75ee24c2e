# Sourced by every bench/*.sh (after `set -euo pipefail`): the build directory
# in $build_dir (the script's first argument, default build/release), the
# repository root as the working directory, and two helpers.
build_dir=${1:-build/release}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# need FILE: stop, naming it, unless the build made FILE.
need() { [ -x "$1" ] || { echo "missing $1: build first (make build)" >&2; exit 1; }; }
# load: the load average now; other work on the cores shows in every ratio.
load() { echo "load: $(uptime | sed 's/.*load average/load average/')"; }
# train CONFIG NAME "FLAGS" [LAUNCHER...]: one `pipeflow train` of $steps
# steps into $runs/NAME ($pipeflow, $steps and $runs set by the script),
# replacing an earlier run there (--overwrite), quiet unless it fails.
train() {
  local config=$1 name=$2 flags=$3
  shift 3
  mkdir -p "$runs"
  # shellcheck disable=SC2086
  "$@" "$pipeflow" train --config "$config" --steps "$steps" --out-dir "$runs/$name" --overwrite $flags >/dev/null \
    2>"$runs/last.err" || { cat "$runs/last.err" >&2; exit 1; }
}
# core_peak [SECONDS]: the core's fp32 (and bf16) FMA peaks now, one line per
# ISA this CPU has, then "best fp32 peak: G GFLOP/s (ISA)" (bench_core_peak:
# register-only kernels, one thread, CPU time); median_peak LINES: the median
# of such G among LINES (the upper one of an even count). A script runs
# core_peak beside what it times, once a round, so that its GFLOP/s are shares
# of a peak measured in the same run; the median, not the best, because the
# core's clock drifts here (178-191 GFLOP/s, once 230) and one fast outlier
# would set every share.
core_peak() { need "$build_dir/bench/bench_core_peak"; "$build_dir/bench/bench_core_peak" --seconds "${1:-0.5}"; }
median_peak() {
  local peaks
  peaks=$(sed -nE 's|^best fp32 peak: ([0-9.]+) GFLOP/s.*|\1|p' <<<"$1" | sort -g)
  sed -n "$(( $(wc -l <<<"$peaks") / 2 + 1 ))p" <<<"$peaks"
}
