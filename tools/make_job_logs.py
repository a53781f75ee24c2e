#!/usr/bin/env python3
"""Writes tests/data/logs/: a Megatron-LM log and a DeepSpeed pipeline-engine log in the formats those programs
print (megatron/core/timers.py, megatron/training/training.py; deepspeed/runtime/pipe/engine.py,
deepspeed/utils/timer.py), of a job whose truth is built in, for `pipeflow analyze`'s tests. Plain Python;
CI never runs it.

The job: 4 pipeline stages, 1F1B, 8 micro-batches per step. Per micro-batch, stage s takes F_s forward and
B_s = 2 F_s backward; stage 2 is the slow one (its device runs at two thirds of the others' speed). The
step is computed here by executing 1F1B with free messages: each action starts when its rank is free and
its input is there. A rank's receive timers hold the time it waited for its input; the optimizer step
follows. truth.json holds the step, each stage's compute, the bubble (1 - compute / (4 * step)) and the slow
stage.

  megatron.log   tensor 2 x pipeline 4 (8 ranks, Megatron's order: global rank = stage * 2 + tensor rank),
                 --timing-log-level 2 --timing-log-option all, log interval 10, 3 intervals (the first
                 slower: warm-up), the arguments block Megatron prints at its start, report_memory lines.
  deepspeed.log  the same job under DeepSpeed's PipelineEngine, wall_clock_breakdown on, steps_per_print
                 10: the partition lines (RANK= STAGE= LAYERS=), the printed configuration, and rank 0's
                 timers only, accumulated over the 10 steps since the last print.

    python3 tools/make_job_logs.py [out-dir]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipeline_orders import one_f_one_b  # noqa: E402

STAGES = 4
MICROBATCHES = 8
FORWARD_MS = [10.0, 10.0, 15.0, 10.0]  # stage 2: the slow device
OPTIMIZER_MS = 4.0
INTERVAL = 10
WARMUP_FACTOR = 1.25  # the first interval's steps are this much slower


def execute():
    """Start and end of every action, and each rank's wait for its inputs."""
    end = {}
    rank_free = [0.0] * STAGES
    waited = [{"F": 0.0, "B": 0.0} for _ in range(STAGES)]
    pending = [list(one_f_one_b(s, STAGES, MICROBATCHES)) for s in range(STAGES)]
    while any(pending):
        progressed = False
        for s in range(STAGES):
            if not pending[s]:
                continue
            kind, m = pending[s][0]
            if kind == "F":
                need = (s - 1, "F", m) if s > 0 else None
            else:
                need = (s + 1, "B", m) if s < STAGES - 1 else (s, "F", m)
            if need is not None and need not in end:
                continue
            ready = end[need] if need is not None else 0.0
            start = max(rank_free[s], ready)
            if need is not None and need[0] != s:
                waited[s][kind] += max(0.0, ready - rank_free[s])
            duration = FORWARD_MS[s] * (1 if kind == "F" else 2)
            end[(s, kind, m)] = start + duration
            rank_free[s] = start + duration
            pending[s].pop(0)
            progressed = True
        assert progressed
    return max(rank_free), waited


def megatron_log(step_ms, waited):
    lines = ["using world size: 8, data-parallel size: 1, context-parallel size: 1, tensor-model-parallel size: 2, "
             "pipeline-model-parallel size: 4",
             "------------------------ arguments ------------------------"]
    arguments = {
        "bf16": "True", "clip_grad": "1.0", "context_parallel_size": "1", "data_parallel_size": "1",
        "ffn_hidden_size": "4096", "fp16": "False", "global_batch_size": "8", "hidden_dropout": "0.1",
        "attention_dropout": "0.1", "hidden_size": "1024", "kv_channels": "64", "log_interval": str(INTERVAL),
        "lr": "0.0003", "max_position_embeddings": "1024", "micro_batch_size": "1", "num_attention_heads": "16",
        "num_layers": "8", "padded_vocab_size": "50304", "pipeline_model_parallel_size": str(STAGES),
        "recompute_granularity": "None", "seq_length": "1024", "sequence_parallel": "False",
        "tensor_model_parallel_size": "2", "timing_log_level": "2", "timing_log_option": "all",
        "train_iters": "30", "use_distributed_optimizer": "False", "vocab_size": "None", "world_size": "8",
        "data_path": "['/data/corpus_text_document']", "tokenizer_type": "GPT2BPETokenizer",
    }
    for name in sorted(arguments):
        lines.append("  {} {} {}".format(name, "." * (48 - len(name)), arguments[name]))
    lines.append("-------------------- end of arguments ---------------------")
    lines.append("> building GPT2BPETokenizer tokenizer ...")
    for interval in range(3):
        factor = WARMUP_FACTOR if interval == 0 else 1.0
        iteration = (interval + 1) * INTERVAL
        step = step_ms * factor + (0.3 * interval if interval else 0)
        lines.append(
            " [2026-12-04 10:{:02d}:00] iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per "
            "iteration (ms): {:.1f} | throughput per GPU (TFLOP/s/GPU): 12.3 | learning rate: 3.000000E-04 | "
            "global batch size: {:5d} | lm loss: {:.6E} | loss scale: 1.0 | grad norm: 1.234 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |".format(
                interval, iteration, 30, iteration * 8, step, 8, 7.5 - interval))
        if interval == 0:
            for rank in range(8):
                stage = rank // 2
                peak = 3000 + 400 * (STAGES - stage)  # 1F1B: stage 0 holds the most micro-batches
                lines.append("[Rank {}] (after {} iterations) memory (MB) | allocated: {:.1f} | max allocated: "
                             "{:.1f} | reserved: {:.1f} | max reserved: {:.1f}".format(
                                 rank, iteration, peak * 0.7, float(peak), peak + 512.0, peak + 512.0))
        timers = {
            "forward-backward": lambda s: (step - OPTIMIZER_MS) * factor,
            "forward-compute": lambda s: MICROBATCHES * FORWARD_MS[s] * factor,
            "backward-compute": lambda s: MICROBATCHES * 2 * FORWARD_MS[s] * factor,
            "forward-recv": lambda s: waited[s]["F"] * factor,
            "backward-recv": lambda s: waited[s]["B"] * factor,
            "forward-send": lambda s: 0.05 if s < STAGES - 1 else 0.0,
            "backward-send": lambda s: 0.05 if s > 0 else 0.0,
            "optimizer": lambda s: OPTIMIZER_MS,
        }
        lines.append("times across ranks (ms):")
        for name, value in timers.items():
            printed = False
            for rank in range(8):
                stage, tensor_rank = rank // 2, rank % 2
                v = value(stage)
                if v <= 0:
                    continue
                v *= 1.002 if tensor_rank == 0 else 0.998  # the two tensor ranks differ a little; their mean is v
                if not printed:
                    lines.append("  {}:".format(name))
                    printed = True
                lines.append("     rank {:2d}: {:.2f}".format(rank, v))
    return "\n".join(lines) + "\n"


def deepspeed_log(step_ms, waited):
    stamp = "[2026-12-04 10:00:00,000] [INFO]"
    lines = ["{} [config.py:1000:print] DeepSpeedEngine configuration:".format(stamp)]
    for key, value in [("gradient_accumulation_steps", MICROBATCHES), ("steps_per_print", INTERVAL),
                       ("train_batch_size", MICROBATCHES), ("train_micro_batch_size_per_gpu", 1),
                       ("wall_clock_breakdown", "True")]:
        lines.append("{} [config.py:1004:print]   {} {} {}".format(stamp, key, "." * (29 - len(key)), value))
    layers = [3, 3, 3, 3]
    first = 0
    for stage in range(STAGES):
        lines.append("RANK={} STAGE={} LAYERS={} [{}, {}) STAGE_PARAMS=12345678 (12.346M) TOTAL_PARAMS=49382712 "
                     "(49.383M) UNIQUE_PARAMS=49382712 (49.383M)".format(stage, stage, layers[stage], first,
                                                                         first + layers[stage]))
        first += layers[stage]
    for interval in range(3):
        factor = WARMUP_FACTOR if interval == 0 else 1.0
        step_s = step_ms * factor / 1000.0
        lines.append("steps: {} loss: {:.4f} iter time (s): {:.3f} samples/sec: {:.3f}".format(
            (interval + 1) * INTERVAL, 2.5 - 0.1 * interval, step_s, MICROBATCHES / step_s))
        total = INTERVAL * factor  # the timers accumulate over the steps since the last print
        lines.append("{} [logging.py:96:log_dist] [Rank 0] time (ms) | batch_input: {:.2f} | fwd_microstep: {:.2f} | "
                     "bwd_microstep: {:.2f} | bwd_inner_microstep: {:.2f} | bwd_allreduce_microstep: {:.2f} | "
                     "step_microstep: {:.2f}".format(
                         stamp, 0.5 * INTERVAL, MICROBATCHES * FORWARD_MS[0] * total,
                         MICROBATCHES * 2 * FORWARD_MS[0] * total, MICROBATCHES * 2 * FORWARD_MS[0] * total - 1,
                         0.01 * INTERVAL, OPTIMIZER_MS * INTERVAL))
        lines.append("{} [logging.py:96:log_dist] [Rank 0] time (ms) | pipe_send_output: {:.2f} | pipe_send_grad: "
                     "0.00 | pipe_recv_input: 0.00 | pipe_recv_grad: {:.2f}".format(
                         stamp, 0.05 * MICROBATCHES * INTERVAL, waited[0]["B"] * total))
    return "\n".join(lines) + "\n"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "logs")
    os.makedirs(out, exist_ok=True)
    pipeline_ms, waited = execute()
    step_ms = pipeline_ms + OPTIMIZER_MS
    compute = [MICROBATCHES * 3 * f for f in FORWARD_MS]
    truth = {"stages": STAGES, "microbatches": MICROBATCHES, "step_ms": step_ms, "compute_ms": compute,
             "bubble": 1 - sum(compute) / (STAGES * step_ms), "stage0_bubble": 1 - compute[0] / step_ms,
             "slow_stage": 2, "first_interval_step_ms": step_ms * WARMUP_FACTOR}
    with open(os.path.join(out, "megatron.log"), "w") as f:
        f.write(megatron_log(step_ms, waited))
    with open(os.path.join(out, "deepspeed.log"), "w") as f:
        f.write(deepspeed_log(step_ms, waited))
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
