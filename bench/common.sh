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
