#!/usr/bin/env bash
# One training step (forward + backward + AdamW) on one thread: pipeflow
# (bench_train_step) against PyTorch (bench/train_step_torch.py, Debian's
# python3-torch) on the same model, in the same run, with the single-thread
# ceiling of the step's GEMMs measured by bench_train_step (sgemm at 1024³;
# oneDNN's bf16 matmul at 1024³ for a step whose GEMMs are bf16) and the
# core's fp32 FMA peak by
# bench_core_peak (common.sh's core_peak, once a round); GPT-2 at two sizes, then a
# Llama of the small GPT-2's size (multi-head, SwiGLU 352: 0.3% more
# parameters) with both implementations, set beside the GPT-2 step; then the
# GPT-2 in bf16 at both sizes (pipeflow's mixed precision; torch.autocast to
# bf16) against fp32, and pipeflow's bf16 step as a share of the core's bf16 peak
# (vdpbf16ps, bench_core_peak). Where the CPU has bf16 instructions a bf16
# step multiplies through oneDNN's bf16 matmul, else in fp32 (on a CPU
# without them bf16 can only cost, the rounding, never gain); a pair after
# them sets that path against the fp32 GEMMs on the same CPU
# (PIPEFLOW_BF16_GEMM=fp32). Each pair alternates for ROUNDS rounds
# (default 3) so that load from other processes hits both. Last, the small
# step's GEMMs by shape, fp32 and bf16: each shape's rate in the step beside
# the same call repeated on dense operands (--gemm-shapes). PyTorch is
# skipped, with a message, where it is missing.
# Usage: bench/train_step.sh [build-dir]   (PYTHON=... for another interpreter)
set -euo pipefail
source "$(dirname "$0")/common.sh"
rounds=${ROUNDS:-3}
bench="$build_dir/bench/bench_train_step"
need "$bench"
need "$build_dir/bench/bench_core_peak"

python=${PYTHON:-/usr/bin/python3}
have_torch=1
if ! OPENBLAS_NUM_THREADS=1 "$python" -c "import torch" >/dev/null 2>&1; then
  have_torch=0
  echo "PyTorch not found ($python -c 'import torch' failed): timing pipeflow only;"
  echo "install Debian's python3-torch for the comparison"
fi

# Both programs print "<name>: W ms/step (median of N, min F), cpu C ms/step,
# G GFLOP/s ..." (pipeflow adds "... of sgemm S GFLOP/s", or "of bf16 GEMM S
# GFLOP/s" where its GEMMs are bf16: oneDNN's bf16 matmul). The summary takes,
# per implementation, the median over rounds of the per-round CPU-time median
# (time-slicing by other processes inflates wall time, not CPU time) and the
# fastest wall-clock step; GFLOP/s and the ceiling and peak shares come from
# CPU time, against the best ceiling (sgemm, or the bf16 GEMM for a bf16
# step) and the median core peak of the rounds.
field() { sed -nE "s|$2|\1|p" <<<"$1"; }
middle() { sort -g | sed -n "$(( (rounds + 1) / 2 ))p"; }
summarise() {
  local lines=$1 sgemm bf16_gemm peak bf16_peak isa flops name
  sgemm=$(field "$lines" '.* of sgemm ([0-9.]+) GFLOP/s.*' | sort -g | tail -1)
  bf16_gemm=$(field "$lines" '.* of bf16 GEMM ([0-9.]+) GFLOP/s.*' | sort -g | tail -1)
  peak=$(median_peak "$lines")
  bf16_peak=$(field "$lines" '^core peak bf16 [a-z0-9_]+: ([0-9.]+) GFLOP/s.*' | middle)
  isa=$(field "$lines" "^best fp32 peak: $peak GFLOP/s \\(([a-z0-9_]+)\\).*" | head -1)
  awk -v r="$rounds" -v s="$sgemm" -v p="$peak" -v i="$isa" -v bg="${bf16_gemm:-0}" -v b="${bf16_peak:-0}" 'BEGIN {
    printf "summary (%d round(s), best sgemm ceiling %s GFLOP/s = %.0f%% of the median core fp32 peak %s GFLOP/s, %s",
           r, s, 100 * s / p, p, i
    if (bg > 0 && b > 0) printf "; best bf16 GEMM ceiling %s GFLOP/s = %.0f%% of the median core bf16 peak %s GFLOP/s", bg, 100 * bg / b, b
    printf "):\n" }'
  for name in pipeflow torch pipeflow-llama torch-llama pipeflow-bf16 torch-bf16; do
    local mine cpu fastest slowest
    mine=$(grep "^$name:" <<<"$lines") || continue
    flops=$(field "$mine" '.*, ([0-9.]+) GFLOP/step.*' | head -1)
    cpu=$(field "$mine" '.*, cpu ([0-9.]+) ms/step.*' | middle)
    fastest=$(field "$mine" '.*, min ([0-9.]+), max .*' | sort -g | head -1)
    slowest=$(field "$mine" '.*, max ([0-9.]+)\).*' | sort -g | tail -1)
    eval "${name//-/_}_cpu=$cpu ${name//-/_}_fastest=$fastest"
    awk -v n="$name" -v c="$cpu" -v f="$fastest" -v w="$slowest" -v flops="$flops" -v s="$sgemm" -v p="$peak" \
        -v b="${bf16_peak:-0}" -v bg="${bf16_gemm:-0}" 'BEGIN {
      g = flops / c * 1000
      ceiling = "sgemm"; limit = "peak"
      if (n ~ /bf16/ && bg > 0 && b > 0) { ceiling = "bf16 GEMM"; s = bg; limit = "bf16 peak"; p = b }
      printf "  %-14s %8.2f ms/step CPU = %6.1f GFLOP/s = %3.0f%% of %s = %3.0f%% of %s; wall-clock steps %.2f to %.2f ms\n",
             n, c, g, 100 * g / s, ceiling, 100 * g / p, limit, f, w }'
  done
  if [ $have_torch = 1 ] && [ -n "${pipeflow_cpu:-}" ]; then
    awk -v pc="$pipeflow_cpu" -v tc="$torch_cpu" -v pf="$pipeflow_fastest" -v tf="$torch_fastest" \
      'BEGIN { printf "  speedup over torch: %.2fx (CPU time per step), %.2fx (fastest wall-clock steps)\n",
               tc / pc, tf / pf }'
  fi
}

run() {
  local name=$1 steps=$2; shift 2
  echo "-- $name: $*"
  local lines=""
  for ((round = 1; round <= rounds; round++)); do
    lines+=$(core_peak)$'\n'
    lines+=$(OPENBLAS_NUM_THREADS=1 "$bench" "$@" --steps "$steps")$'\n'
    if [ $have_torch = 1 ]; then
      lines+=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$python" bench/train_step_torch.py "$@" --steps "$steps")$'\n'
    fi
  done
  printf '%s' "$lines"
  summarise "$lines"
}

small=(--layers 4 --heads 4 --width 128 --context 64 --batch 16)
larger=(--layers 6 --heads 6 --width 384 --context 256 --batch 16)
run "small (vocab 256, context 64, 4 layers, 4 heads, width 128, batch 16)" 20 "${small[@]}"
run "larger (vocab 256, context 256, 6 layers, 6 heads, width 384, batch 16)" 4 "${larger[@]}"

# A variant of a model beside its plain run, alternating in one run, in
# pipeflow and in PyTorch:
#   paired TITLE RATIO VARIANT PIPEFLOW_ARGS TORCH_ARGS [STEPS MODEL_ARGS...]
# prints each implementation's variant / plain CPU time per step; the model is
# the small one (20 steps) unless STEPS and its flags follow.
paired() {
  local title=$1 ratio=$2 variant=$3 pipeflow_args=$4 torch_args=$5 steps=${6:-20} lines=""
  local args=("${small[@]}")
  if [ $# -gt 6 ]; then args=("${@:7}"); fi
  echo "-- $title: ${args[*]}"
  for ((round = 1; round <= rounds; round++)); do
    lines+=$(core_peak)$'\n'
    lines+=$(OPENBLAS_NUM_THREADS=1 "$bench" "${args[@]}" --steps "$steps")$'\n'
    # shellcheck disable=SC2086 # the variant's flags, split on purpose
    lines+=$(OPENBLAS_NUM_THREADS=1 "$bench" "${args[@]}" --steps "$steps" $pipeflow_args)$'\n'
    if [ $have_torch = 1 ]; then
      lines+=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$python" bench/train_step_torch.py "${args[@]}" \
               --steps "$steps")$'\n'
      # shellcheck disable=SC2086
      lines+=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$python" bench/train_step_torch.py "${args[@]}" \
               --steps "$steps" $torch_args)$'\n'
    fi
  done
  printf '%s' "$lines"
  pipeflow_cpu="" summarise "$lines"
  for name in pipeflow torch; do
    local plain changed
    # (|| true: without PyTorch grep finds no torch lines, and under
    # pipefail the failed assignment would end the script)
    plain=$(grep "^$name:" <<<"$lines" | sed -nE 's|.*, cpu ([0-9.]+) ms/step.*|\1|p' | middle) || true
    changed=$(grep "^$name-$variant:" <<<"$lines" | sed -nE 's|.*, cpu ([0-9.]+) ms/step.*|\1|p' | middle) || true
    # (an if, not &&: without PyTorch the torch pair is empty, and a false
    # test as the loop's last command would end the script under set -e)
    if [ -n "$plain" ] && [ -n "$changed" ]; then
      awk -v a="$plain" -v b="$changed" -v n="$name" -v r="$ratio" \
        'BEGIN { printf "  %s: %s = %.2f (CPU time per step)\n", n, r, b / a }'
    fi
  done
}

# A Llama of the small GPT-2's size, and the GPT-2 in bf16.
paired "llama vs gpt-2 of the same size (llama: --intermediate 352)" "llama step / gpt-2 step" llama \
  "--arch llama --intermediate 352" "--arch llama --intermediate 352"
grep -o -m1 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sed 's/^/-- this CPU has /' || echo "-- this CPU has no bf16 instructions"
paired "bf16 vs fp32" "bf16 step / fp32 step" bf16 "--format bf16" "--format bf16"
paired "bf16 vs fp32, larger model" "bf16 step / fp32 step" bf16 "--format bf16" "--format bf16" 4 "${larger[@]}"

# The bf16 step's two GEMM paths on this CPU, alternating: the default
# (oneDNN's bf16 matmul where the CPU has bf16 instructions) against fp32
# GEMMs on the rounded values (PIPEFLOW_BF16_GEMM=fp32).
bf16_paths() {
  local args=("${small[@]}" --steps 20 --format bf16) lines="" fp32 own
  echo "-- bf16 step, its GEMMs: default path vs PIPEFLOW_BF16_GEMM=fp32: ${args[*]}"
  for ((round = 1; round <= rounds; round++)); do
    lines+="default $(OPENBLAS_NUM_THREADS=1 "$bench" "${args[@]}")"$'\n'
    lines+="fp32 $(PIPEFLOW_BF16_GEMM=fp32 OPENBLAS_NUM_THREADS=1 "$bench" "${args[@]}")"$'\n'
  done
  printf '%s' "$lines"
  own=$(grep '^default ' <<<"$lines" | sed -nE 's|.*, cpu ([0-9.]+) ms/step.*|\1|p' | middle)
  fp32=$(grep '^fp32 ' <<<"$lines" | sed -nE 's|.*, cpu ([0-9.]+) ms/step.*|\1|p' | middle)
  awk -v a="$fp32" -v b="$own" 'BEGIN { printf "  fp32-GEMM bf16 step / default bf16 step = %.2f (CPU time per step)\n", a / b }'
}
bf16_paths

# Where the small model's step multiplies, fp32 and bf16: each GEMM shape's
# rate in the step beside the same call repeated on dense operands
# (bench_train_step --gemm-shapes), one run each.
for format in fp32 bf16; do
  echo "-- GEMMs by shape, $format: ${small[*]} --steps 20 --format $format --gemm-shapes"
  OPENBLAS_NUM_THREADS=1 "$bench" "${small[@]}" --steps 20 --format "$format" --gemm-shapes | grep -v '^pipeflow'
done
