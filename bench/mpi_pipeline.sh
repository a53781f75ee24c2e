#!/usr/bin/env bash
# pipeflow train under mpirun against the same run in one process, on make
# run's model (examples/train_1f1b_2stage.json), with pipeflow's own
# metrics.jsonl (steps after the first: min / median / max):
#   pp 2: 2 MPI processes vs 2 threads of one process (step-time ratio,
#         communication's share of the step, measured vs predicted bubble);
#   dp 2: 2 MPI processes of 1 stage each vs 1 process of 1 stage on the same
#         global batch (throughput ratio).
# Each run is a separate process, one after the other; the load average is
# printed around them (other work on the cores shows in every ratio).
# Usage: bench/mpi_pipeline.sh [build-dir]   (STEPS=... to change; default 20)
set -euo pipefail
build_dir=${1:-build/release}
cd "$(dirname "$0")/.."
pipeflow="$build_dir/pipeflow"
[ -x "$pipeflow" ] || { echo "missing $pipeflow: build first (make build)" >&2; exit 1; }
steps=${STEPS:-20}
config=examples/train_1f1b_2stage.json
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpirun=(mpirun --allow-run-as-root --bind-to core --timeout 600)
# train NAME "FLAGS" [LAUNCHER...]: one run into $out/NAME
train() {
  local name=$1 flags=$2
  shift 2
  # shellcheck disable=SC2086
  "$@" "$pipeflow" train --config "$config" --steps "$steps" --out-dir "$out/$name" $flags >/dev/null \
    2>"$out/last.err" || { cat "$out/last.err" >&2; exit 1; }
}
load() { echo "load: $(uptime | sed 's/.*load average/load average/')"; }
load
train threads ""
train mpi "" "${mpirun[@]}" -np 2
train one "--stages 1"
train dp2 "--stages 1 --data-parallel 2" "${mpirun[@]}" -np 2
load
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def steps(name):
    rows = [json.loads(line) for line in open(f"{out}/{name}/metrics.jsonl")]
    return rows[1:]  # the first step warms the buffer pools up
def spread(values, fmt="{:.1f}"):
    return "min " + fmt.format(min(values)) + " / median " + fmt.format(statistics.median(values)) + " / max " + fmt.format(max(values))
runs = {name: steps(name) for name in ["threads", "mpi", "one", "dp2"]}
for name, rows in runs.items():
    print(f"{name:8s} step ms {spread([r['step_time_s'] * 1e3 for r in rows])}   tokens/s {spread([r['tokens_per_s'] for r in rows], '{:.0f}')}")
med = lambda name, key: statistics.median(r[key] for r in runs[name])
print(f"pp 2: MPI / threads step time (medians): {med('mpi', 'step_time_s') / med('threads', 'step_time_s'):.3f}"
      f"  (threads / MPI speed: {med('threads', 'step_time_s') / med('mpi', 'step_time_s'):.3f})")
share = [max(r['comm_s']) / r['step_time_s'] for r in runs['mpi']]
print(f"pp 2 under MPI: communication share of the step (the rank with most) {spread([100 * s for s in share], '{:.2f}')} %")
gap = [100 * (r['bubble_measured'] - r['bubble_predicted']) for r in runs['mpi']]
print(f"pp 2 under MPI: bubble measured - predicted, points: {spread(gap)}")
print(f"pp 2 under MPI: fraction of the ideal {spread([100 * r['ideal_fraction'] for r in runs['mpi']])} %")
print(f"dp 2: MPI throughput / one process (medians): {med('dp2', 'tokens_per_s') / med('one', 'tokens_per_s'):.3f}")
PY
