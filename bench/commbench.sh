#!/usr/bin/env bash
# pipeflow's MPI point-to-point path against raw MPI in the same run:
# `pipeflow commbench` on 2 processes (1 KiB ... 64 MiB, 20 timed rounds per
# size); the p2p/baseline column is the ratio docs/PERFORMANCE.md records.
# The load average is printed around it: other work on the cores shows there.
# Usage: bench/commbench.sh [build-dir]   (NP=... for more processes)
set -euo pipefail
source "$(dirname "$0")/common.sh"
pipeflow="$build_dir/pipeflow"
need "$pipeflow"
as_root=()
[ "$(id -u)" = 0 ] && as_root=(--allow-run-as-root)
load
mpirun "${as_root[@]}" --oversubscribe -np "${NP:-2}" "$pipeflow" commbench
load
