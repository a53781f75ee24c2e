#!/usr/bin/env bash
# Tensor parallelism on this machine's 2 cores: pipeflow train with one
# stage split over 2 tensor-parallel ranks (threads, and 2 MPI processes)
# against the same stage on 1 rank (the baseline, same global batch), and
# against 2 pipeline stages (the other way to use the second core), on two
# models: make run's (width 128, examples/train_1f1b_2stage.json) and a
# wider one (width 512, 8 heads, written below). Per run, from its
# metrics.jsonl: the first step alone, then min / median / max of the later
# steps' time and tokens/s; the throughput ratios to the 1-rank run; and each
# tensor-parallel run's all-reduce share of the step (the rank with most),
# measured beside the simulator's ring all-reduce of the same bytes on the
# cpu profile's link (tensor_parallel_predicted_s).
# Each run is a separate process, one after the other; the load average is
# printed around them (other work on the cores shows in every ratio).
# Usage: bench/tensor_parallel.sh [build-dir]   (STEPS=... to change; default 20)
set -euo pipefail
source "$(dirname "$0")/common.sh"
pipeflow="$build_dir/pipeflow"
need "$pipeflow"
steps=${STEPS:-20}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpirun=(mpirun --allow-run-as-root --bind-to core --timeout 600)
cat >"$out/wide.json" <<'JSON'
{
  "model": {"n_layer": 4, "n_head": 8, "n_embd": 512, "n_ctx": 64, "vocab_size": 256},
  "train_batch_size": 32,
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "pipeline": {"stages": 2, "schedule": "1f1b", "partition_method": "balanced"},
  "hardware": "cpu",
  "eval_interval": 0,
  "seed": 1
}
JSON
runs=$out/runs
for config in examples/train_1f1b_2stage.json "$out/wide.json"; do
  echo "== $(basename "$config"): $(sed -n 's/.*"model": \({[^}]*}\).*/\1/p' "$config")"
  load
  train "$config" one "--stages 1"
  train "$config" tp2 "--stages 1 --tp 2"
  train "$config" tp2mpi "--stages 1 --tp 2" "${mpirun[@]}" -np 2
  train "$config" pp2 "--stages 2"
  load
  /usr/bin/python3 - "$out/runs" <<'PY'
import statistics, sys
sys.path.insert(0, "bench")
from metrics import rows as rows_in, spread
out = sys.argv[1]
rows = lambda name: rows_in(out, name)
names = ["one", "tp2", "tp2mpi", "pp2"]
every = {name: rows(name) for name in names}
runs = {name: r[1:] for name, r in every.items()}  # after the first step
for name in names:
    r = runs[name]
    print(f"{name:7s} first step ms {every[name][0]['step_time_s'] * 1e3:.1f}; later: step ms {spread([x['step_time_s'] * 1e3 for x in r])}"
          f"   tokens/s {spread([x['tokens_per_s'] for x in r], '{:.0f}')}")
med = lambda name, key: statistics.median(x[key] for x in runs[name])
for name in ["tp2", "tp2mpi", "pp2"]:
    worst = min(x['tokens_per_s'] for x in runs[name]) / min(x['tokens_per_s'] for x in runs['one'])
    print(f"{name}: throughput / 1 rank (medians) {med(name, 'tokens_per_s') / med('one', 'tokens_per_s'):.3f}"
          f"  (slowest steps: {worst:.3f})")
for name in ["tp2", "tp2mpi"]:
    measured = [100 * max(x['tensor_parallel_s']) / x['step_time_s'] for x in runs[name]]
    predicted = [100 * max(x['tensor_parallel_predicted_s']) / x['step_time_s'] for x in runs[name]]
    print(f"{name}: tensor-parallel all-reduces' share of the step: measured {spread(measured)} %,"
          f" predicted {spread(predicted, '{:.2f}')} %")
PY
  rm -rf "${out:?}"/runs
done
