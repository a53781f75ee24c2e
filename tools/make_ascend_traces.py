#!/usr/bin/env python3
"""Writes tests/data/logs/ascend/: the step_trace_time.csv torch_npu's profiler writes for each device of a job
(one *_ascend_pt folder per rank, the file under its ASCEND_PROFILER_OUTPUT/, with the profiler_info_{R}.json that
names the folder's rank), for `pipeflow analyze FOLDER`'s tests. Plain Python; CI never runs it.

The job is tools/make_job_logs.py's (4 pipeline stages, 1F1B, 8 micro-batches, stage 2 slow), on 8 devices:
tensor 2 x pipeline 4, global rank = stage * 2 + tensor rank (Megatron's order, which MindSpeed keeps); the two
tensor ranks of a stage differ a little, their mean is the stage. Its columns, per step and device, in
microseconds, as torch_npu defines them:

  Computing        the device's compute kernels: the stage's forwards and backwards and the optimizer step
  Communication(Not Overlapped)
                   communication not hidden by compute: the receives and the sends not overlapped
  Overlapped       communication under compute (some sends)
  Communication    all communication
  Free             neither (host gaps)
  Bubble           the time in receive operators: with the devices' steps back to back, a stage's every wait
                   for its neighbours' data is a receive
  Stage            the step less its receives
  Communication(Not Overlapped and Exclude Receive)
                   the sends not overlapped
  Preparing        from the step's start to its first operator

So Computing + Communication(Not Overlapped) + Free is the step, and Stage + Bubble too. ascend-truth.json
holds the step, each stage's compute, the truth's bubble (1 - compute / (4 * step), as make_job_logs.py's),
the Bubble column's share of the step (sum of Bubble / (8 * step)) and the slow stage.

    python3 tools/make_ascend_traces.py [out-dir]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_job_logs import FORWARD_MS, MICROBATCHES, OPTIMIZER_MS, STAGES, execute  # noqa: E402

TENSOR = 2
STEPS = [3, 4, 5]  # the ProfilerSteps the schedule recorded
SEND_MS = 0.05     # each send's own time, not overlapped
OVERLAPPED_MS = 0.8
FREE_MS = 0.3
PREPARING_MS = 0.2
HEADER = ("Device_id,Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
          "Communication(Not Overlapped and Exclude Receive),Preparing")


def device_rows(stage, tensor_rank, step_ms):
    """One row per step of the device, in microseconds."""
    skew = 1.002 if tensor_rank == 0 else 0.998
    compute = MICROBATCHES * 3 * FORWARD_MS[stage] * skew + OPTIMIZER_MS
    sends = SEND_MS * MICROBATCHES * ((stage < STAGES - 1) + (stage > 0))
    bubble = step_ms - compute - sends - FREE_MS
    assert bubble > 0
    not_overlapped = bubble + sends
    rows = []
    for step in STEPS:
        values = [compute, not_overlapped, OVERLAPPED_MS, not_overlapped + OVERLAPPED_MS, FREE_MS,
                  step_ms - bubble, bubble, sends, PREPARING_MS]
        rows.append("{},{},".format(stage * TENSOR + tensor_rank, step) +
                    ",".join("{:.3f}".format(v * 1000) for v in values))
    return rows, bubble


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                             "logs")
    pipeline_ms, _ = execute()
    step_ms = pipeline_ms + OPTIMIZER_MS
    bubbles = 0.0
    for rank in range(STAGES * TENSOR):
        stage, tensor_rank = rank // TENSOR, rank % TENSOR
        # torch_npu names the folder {worker}_{pid}_{time}_ascend_pt; the pids do not follow the ranks.
        folder = os.path.join(out, "ascend", "node0_{}_20261204100000000_ascend_pt".format(4000 + (rank * 5) % 8))
        os.makedirs(os.path.join(folder, "ASCEND_PROFILER_OUTPUT"), exist_ok=True)
        with open(os.path.join(folder, "profiler_info_{}.json".format(rank)), "w") as f:
            json.dump({"rank_id": rank}, f)  # pipeflow reads the rank from the name only
            f.write("\n")
        rows, bubble = device_rows(stage, tensor_rank, step_ms)
        bubbles += bubble
        with open(os.path.join(folder, "ASCEND_PROFILER_OUTPUT", "step_trace_time.csv"), "w") as f:
            f.write("\n".join([HEADER] + rows) + "\n")
    compute = [MICROBATCHES * 3 * f for f in FORWARD_MS]
    truth = {"stages": STAGES, "tensor_parallel": TENSOR, "microbatches": MICROBATCHES, "step_ms": step_ms,
             "compute_ms": compute, "bubble": 1 - sum(compute) / (STAGES * step_ms),
             "bubble_column_share": bubbles / (STAGES * TENSOR * step_ms), "slow_stage": 2}
    with open(os.path.join(out, "ascend-truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
