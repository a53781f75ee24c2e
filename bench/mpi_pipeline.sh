#!/usr/bin/env bash
# pipeflow train under mpirun against the same run in one process, with
# pipeflow's own metrics.jsonl, on two models: the small one of
# examples/train_1f1b_2stage_small.json and make run's
# (examples/train_1f1b_2stage.json). Per model:
#   pp 2: 2 MPI processes vs 2 threads of one process (step-time ratio,
#         communication's share of the step, measured vs predicted bubble);
#   dp 2: 2 MPI processes of 1 stage each, and 2 threads of one process
#         (the rank group in threads), vs 1 process of 1 stage on the same
#         global batch (throughput ratios), and threads vs MPI.
# Steps after the first give min / median / max; the first step (buffer
# pools warming up, MPI connections made) is shown on its own.
# Each run is a separate process, one after the other; the load average is
# printed around them (other work on the cores shows in every ratio).
# Usage: bench/mpi_pipeline.sh [build-dir]   (STEPS=... to change; default 20)
set -euo pipefail
source "$(dirname "$0")/common.sh"
pipeflow="$build_dir/pipeflow"
need "$pipeflow"
steps=${STEPS:-20}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpirun=(mpirun --allow-run-as-root --bind-to core --timeout 600)
runs=$out
for model in small make_run; do
  config=examples/train_1f1b_2stage.json
  [ "$model" = small ] && config=examples/train_1f1b_2stage_small.json
  echo "== $config"
  load
  train "$config" threads ""
  train "$config" mpi "" "${mpirun[@]}" -np 2
  train "$config" one "--stages 1"
  train "$config" dp2 "--stages 1 --data-parallel 2" "${mpirun[@]}" -np 2
  train "$config" dp2threads "--stages 1 --data-parallel 2"
  load
  /usr/bin/python3 - "$out" <<'PY'
import statistics, sys
sys.path.insert(0, "bench")
from metrics import rows as rows_in, spread
out = sys.argv[1]
rows = lambda name: rows_in(out, name)
every = {name: rows(name) for name in ["threads", "mpi", "one", "dp2", "dp2threads"]}
runs = {name: r[1:] for name, r in every.items()}  # after the first step
for name, r in runs.items():
    print(f"{name:8s} first step ms {every[name][0]['step_time_s'] * 1e3:.1f}; later: step ms {spread([x['step_time_s'] * 1e3 for x in r])}"
          f"   tokens/s {spread([x['tokens_per_s'] for x in r], '{:.0f}')}")
med = lambda name, key: statistics.median(x[key] for x in runs[name])
print(f"pp 2: MPI / threads step time (medians): {med('mpi', 'step_time_s') / med('threads', 'step_time_s'):.3f}"
      f"  (threads / MPI speed: {med('threads', 'step_time_s') / med('mpi', 'step_time_s'):.3f})")
share = [max(x['comm_s']) / x['step_time_s'] for x in runs['mpi']]
print(f"pp 2 under MPI: communication share of the step (the rank with most) {spread([100 * s for s in share], '{:.2f}')} %")
gap = [100 * (x['bubble_measured'] - x['bubble_predicted']) for x in runs['mpi']]
print(f"pp 2 under MPI: bubble measured - predicted, points: {spread(gap)}")
for name in ["threads", "mpi"]:
    print(f"pp 2 {name}: fraction of the ideal {spread([100 * x['ideal_fraction'] for x in runs[name]])} %")
print(f"dp 2: MPI throughput / one process (medians): {med('dp2', 'tokens_per_s') / med('one', 'tokens_per_s'):.3f}")
print(f"dp 2: threads throughput / one process (medians): {med('dp2threads', 'tokens_per_s') / med('one', 'tokens_per_s'):.3f}"
      f"  (threads / MPI: {med('dp2threads', 'tokens_per_s') / med('dp2', 'tokens_per_s'):.3f})")
for name in ["dp2", "dp2threads"]:
    reduction = [100 * x['data_parallel_s'][0] / x['step_time_s'] for x in runs[name]]
    print(f"dp 2 {name}: the data-parallel reduction's share of the step {spread(reduction, '{:.2f}')} %")
PY
  rm -rf "${out:?}"/*
done
