#!/usr/bin/env bash
# The cost of measuring the gradient noise scale on two models: the small one
# of examples/train_1f1b_2stage_small.json (where the measurement weighs
# most against the step) and make run's (examples/train_1f1b_2stage.json,
# 2-stage 1F1B, 8 micro-batches of 8 × 64 tokens). Per model, one run with
# metrics.noise_scale_interval = 2, so that measured
# (even) and unmeasured (odd) steps alternate under the same load; the
# median step time of each over steps 4 … STEPS−1 and their ratio − 1 (the
# share of the step the measurement adds), from the run's metrics.jsonl.
# Usage: bench/noise_scale_cost.sh [build-dir]   (STEPS=... to change; default 80)
set -euo pipefail
source "$(dirname "$0")/common.sh"
pipeflow="$build_dir/pipeflow"
need "$pipeflow"
steps=${STEPS:-80}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for config in examples/train_1f1b_2stage_small.json examples/train_1f1b_2stage.json; do
echo "== $config"
/usr/bin/python3 - "$out" "$config" <<'PY'
import json, sys
config = json.load(open(sys.argv[2]))
config["metrics"] = {"noise_scale_interval": 2}
json.dump(config, open(sys.argv[1] + "/config.json", "w"))
PY
load
rm -rf "$out/run"
"$pipeflow" train --config "$out/config.json" --steps "$steps" --out-dir "$out/run" >/dev/null 2>"$out/err" ||
  { cat "$out/err" >&2; exit 1; }
load
/usr/bin/python3 - "$out/run/metrics.jsonl" <<'PY'
import json, statistics, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
measured = [l["step_time_s"] for l in lines if l["step"] >= 4 and "grad_square_small" in l]
plain = [l["step_time_s"] for l in lines if l["step"] >= 4 and "grad_square_small" not in l]
m, p = statistics.median(measured), statistics.median(plain)
print(f"measured steps: {len(measured)}, median {1e3 * m:.1f} ms; unmeasured: {len(plain)}, median {1e3 * p:.1f} ms")
print(f"cost of the measurement: {100 * (m / p - 1):+.2f}% of the step (target <= 3%)")
print(f"last noise_scale: {[l['noise_scale'] for l in lines if 'noise_scale' in l][-1]:.1f} sequences")
PY
done
