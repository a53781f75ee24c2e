#!/usr/bin/env bash
# One GPT-2 training step (forward + backward + AdamW) on one thread: pipeflow
# (bench_train_step) against PyTorch (bench/train_step_torch.py, Debian's
# python3-torch) on the same model, in the same run, with the single-thread
# sgemm ceiling measured by bench_train_step. PyTorch is skipped, with a
# message, where it is missing. Usage: bench/train_step.sh [build-dir]
# (PYTHON=... names another interpreter than /usr/bin/python3.)
set -euo pipefail
build_dir=${1:-build/release}
cd "$(dirname "$0")/.."
bench="$build_dir/bench/bench_train_step"
[ -x "$bench" ] || { echo "missing $bench: build first (make build)" >&2; exit 1; }

python=${PYTHON:-/usr/bin/python3}
have_torch=1
if ! OPENBLAS_NUM_THREADS=1 "$python" -c "import torch" >/dev/null 2>&1; then
  have_torch=0
  echo "PyTorch not found ($python -c 'import torch' failed): timing pipeflow only;"
  echo "install Debian's python3-torch for the comparison"
fi

# Fields of the lines both programs print: "<name>: X ms/step (median of N,
# min Y), G GFLOP/s ...", pipeflow's also "... of sgemm S GFLOP/s".
median_ms() { sed -E 's/^[a-z]+: ([0-9.]+) ms\/step.*/\1/' <<<"$1"; }
min_ms() { sed -E 's/.*, min ([0-9.]+)\).*/\1/' <<<"$1"; }
gflops() { sed -E 's/.*\), ([0-9.]+) GFLOP\/s.*/\1/' <<<"$1"; }
ceiling() { sed -E 's/.* of sgemm ([0-9.]+) GFLOP\/s.*/\1/' <<<"$1"; }

run() {
  local name=$1 steps=$2; shift 2
  echo "-- $name: $*"
  local ours theirs
  ours=$(OPENBLAS_NUM_THREADS=1 "$bench" "$@" --steps "$steps")
  echo "$ours"
  if [ $have_torch = 1 ]; then
    theirs=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$python" bench/train_step_torch.py "$@" --steps "$steps")
    echo "$theirs"
    awk -v ours="$(median_ms "$ours")" -v theirs="$(median_ms "$theirs")" \
        -v ours_min="$(min_ms "$ours")" -v theirs_min="$(min_ms "$theirs")" \
        -v torch_gflops="$(gflops "$theirs")" -v sgemm="$(ceiling "$ours")" \
      'BEGIN { printf "torch: %.0f%% of the sgemm ceiling\n", 100 * torch_gflops / sgemm;
               printf "speedup over torch: %.2fx (median step time), %.2fx (fastest step)\n",
               theirs / ours, theirs_min / ours_min }'
  fi
}

run "small (vocab 256, context 64, 4 layers, 4 heads, width 128, batch 16)" 20 \
  --layers 4 --heads 4 --width 128 --context 64 --batch 16
run "larger (vocab 256, context 256, 6 layers, 6 heads, width 384, batch 16)" 3 \
  --layers 6 --heads 6 --width 384 --context 256 --batch 16
