#!/usr/bin/python3
"""Writes tests/data/traces/: PyTorch profiler traces of a real two-process pipeline, for `pipeflow analyze`'s
tests (CI never runs this script; it needs Debian's python3-torch).

Two processes (gloo over TCP, one thread each) train a pipeline of Linear+tanh layers: stage 0 holds 2 layers,
stage 1 holds 4 and the loss, so stage 1 is the slow stage, twice stage 0's work. Each runs under
torch.profiler for one warm-up step and three recorded ones (prof.step() marks ProfilerStep#1..#3) and labels its actions as
torch.distributed.pipelining does:

  torch-1f1b/   1F1B, 4 micro-batches, every action "PP:" + the action's text ("PP:0F1", "PP:1RECV_F0",
                "PP:0SEND_B2"), sends posted with isend (waited at the step's end), receives blocking;
                files named as torchtitan names them (rank{R}_trace.json).
  torch-gpipe/  GPipe, 4 micro-batches, "Forward {i}" / "Backward {i}" around the compute only (the
                send and receive go unlabelled), as pipelining's single-stage schedules label them;
                gzipped and named as Megatron-LM names its profiles (rank-{R}.json.gz).
  kineto-1f1b/  torch-1f1b's events in the Kineto layout, gzipped and named as tensorboard_trace_handler
                names them ({host}_{pid}.{ns}.pt.trace.json.gz): Debian's torch 1.13 is built without
                Kineto (torch.autograd.kineto_available() is False), so its profiler writes the legacy
                layout -- a bare list of events, "ts" in microseconds from each process's own profiler
                start -- and this copy converts it: an object with "traceEvents" (cat "cpu_op" or
                "user_annotation"), "distributedInfo" {backend, rank, world_size}, and
                "baseTimeNanoseconds" with each event's "ts" relative to it.

Each folder has truth.json: what the run measured itself with time.time_ns() (one clock for both
processes), per step (numbered as the trace's ProfilerStep#N; torch 1.13 numbers the recorded steps from 0):
every labelled action's, GPipe's unlabelled transfers' ("recv F0", "send B3") and the optimizer step's start
and end, the bubble (1 - compute / (2 * the step's span, first of them to the last end)), and each rank's profiler clock offset (wall time minus trace time,
microseconds).

    /usr/bin/python3 tools/make_torch_traces.py [out-dir]
"""

import gzip
import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one BLAS thread per process: two processes share two cores
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import profile, record_function, ProfilerActivity

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipeline_orders import gpipe, one_f_one_b  # noqa: E402

WIDTH = 384
ROWS = 64
MICROBATCHES = 4
STEPS = 3
LAYERS = [2, 4]  # per stage: stage 1 is the slow one
PORT = 29561


def run_rank(rank, schedule, out, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(1 + rank)
    layers = torch.nn.Sequential(*[m for _ in range(LAYERS[rank]) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())])
    optimizer = torch.optim.SGD(layers.parameters(), lr=1e-3)
    inputs = [torch.randn(ROWS, WIDTH) for _ in range(MICROBATCHES)]
    order = (one_f_one_b if schedule == "1f1b" else gpipe)(rank, 2, MICROBATCHES)
    pp = schedule == "1f1b"  # PP: labels on every action; GPipe: Forward/Backward only

    truth = {"steps": []}
    wall = time.time_ns

    def timed(label, actions, fn):
        with record_function(label):  # the truth inside the label's span
            start = wall()
            result = fn()
            end = wall()
        actions.append({"action": label, "start_ns": start, "end_ns": end})
        return result

    def unlabelled(name, actions, fn):
        """GPipe's transfers carry no label: timed for the truth's span only, under a name no label has."""
        start = wall()
        result = fn()
        actions.append({"action": name, "start_ns": start, "end_ns": wall()})
        return result

    dist.barrier()
    time.sleep(0.005 * rank)  # the ranks reach the profiler at different times, as in a real job
    path = os.path.join(out, f"rank{rank}_trace.json")
    # One warm-up step, then STEPS recorded: ProfilerStep#1 .. #STEPS (torch marks steps only with a schedule).
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=torch.profiler.schedule(wait=0, warmup=1, active=STEPS, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for step in range(1 + STEPS):
            actions = []
            outputs, received, pending = {}, {}, []
            for kind, m in order:
                if kind == "F":
                    if rank == 0:
                        x = inputs[m]
                    else:
                        buf = torch.empty(ROWS, WIDTH)
                        if pp:
                            timed(f"PP:1RECV_F{m}", actions, lambda: dist.recv(buf, 0))
                        else:
                            unlabelled(f"recv F{m}", actions, lambda: dist.recv(buf, 0))
                        x = buf.requires_grad_()
                        received[m] = x
                    label = f"PP:{rank}F{m}" if pp else f"Forward {m}"
                    y = timed(label, actions, lambda: layers(x))
                    if rank == 0:
                        outputs[m] = y
                        if pp:
                            pending.append(timed(f"PP:0SEND_F{m}", actions, lambda: dist.isend(y.detach(), 1)))
                        else:
                            pending.append(unlabelled(f"send F{m}", actions, lambda: dist.isend(y.detach(), 1)))
                    else:
                        outputs[m] = (y * y).mean()
                else:
                    label = f"PP:{rank}B{m}" if pp else f"Backward {m}"
                    if rank == 1:
                        timed(label, actions, lambda: outputs[m].backward())
                        grad = received[m].grad
                        if pp:
                            pending.append(timed(f"PP:1SEND_B{m}", actions, lambda: dist.isend(grad, 0)))
                        else:
                            pending.append(unlabelled(f"send B{m}", actions, lambda: dist.isend(grad, 0)))
                    else:
                        grad = torch.empty(ROWS, WIDTH)
                        if pp:
                            timed(f"PP:0RECV_B{m}", actions, lambda: dist.recv(grad, 1))
                        else:
                            unlabelled(f"recv B{m}", actions, lambda: dist.recv(grad, 1))
                        timed(label, actions, lambda: outputs[m].backward(grad))
            for work in pending:
                work.wait()
            start = wall()
            optimizer.step()  # torch labels it Optimizer.step#SGD.step
            actions.append({"action": "Optimizer.step#SGD.step", "start_ns": start, "end_ns": wall()})
            optimizer.zero_grad()
            truth["steps"].append({"step": step, "actions": actions})
            prof.step()
    dist.barrier()
    dist.destroy_process_group()
    queue.put((rank, truth))


def offset_us(trace_events, steps):
    """Wall-clock minus trace time of one labelled action, in microseconds (both are the same event)."""
    first = next(a for a in steps[-1]["actions"] if is_compute(a["action"]))
    for e in trace_events:
        if e.get("name") == first["action"] and e.get("ph") == "X":
            last = e  # the last occurrence: the last step's
    return first["start_ns"] / 1000.0 - last["ts"]


def write_truth(out, schedule, truths, offsets, numbers):
    """numbers: the trace's ProfilerStep numbers of the recorded steps, in order."""
    steps = []
    for step, number in zip(range(1, 1 + STEPS), numbers):
        per_rank = [truths[r]["steps"][step]["actions"] for r in range(2)]
        start = min(a["start_ns"] for acts in per_rank for a in acts)
        end = max(a["end_ns"] for acts in per_rank for a in acts)
        compute = [sum(a["end_ns"] - a["start_ns"] for a in acts if is_compute(a["action"])) for acts in per_rank]
        steps.append({
            "step": number,
            "span_us": (end - start) / 1000.0,
            "compute_us": [c / 1000.0 for c in compute],
            "bubble": 1 - sum(compute) / (2.0 * (end - start)),
            "actions": [[{"action": a["action"], "start_us": (a["start_ns"] - start) / 1000.0,
                          "end_us": (a["end_ns"] - start) / 1000.0} for a in acts] for acts in per_rank],
        })
    truth = {"schedule": schedule, "stages": 2, "microbatches": MICROBATCHES, "layers_per_stage": LAYERS,
             "slow_stage": 1, "clock_offset_us": offsets, "steps": steps}
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
        f.write("\n")


def is_compute(label):
    if label.startswith("PP:"):
        return "SEND" not in label and "RECV" not in label
    return label.startswith("Forward ") or label.startswith("Backward ")


def record(out, schedule, port):
    os.makedirs(out, exist_ok=True)
    queue = mp.get_context("spawn").SimpleQueue()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run_rank, args=(r, schedule, out, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    truths = dict(queue.get() for _ in range(2))
    for p in procs:
        p.join()
        assert p.exitcode == 0
    offsets = []
    for r in range(2):
        with open(os.path.join(out, f"rank{r}_trace.json")) as f:
            events = json.load(f)
        offsets.append(offset_us(events, truths[r]["steps"]))
        numbers = sorted(int(e["name"][len("ProfilerStep#"):]) for e in events if e["name"].startswith("ProfilerStep#"))
        assert len(numbers) == STEPS, numbers
        if schedule == "gpipe":
            with gzip.open(os.path.join(out, f"rank-{r}.json.gz"), "wt", compresslevel=9) as f:
                json.dump(events, f, separators=(",", ":"))
            os.remove(os.path.join(out, f"rank{r}_trace.json"))
    write_truth(out, schedule, truths, offsets, numbers)
    return truths, offsets


def kineto_copy(legacy, out):
    """legacy's traces in the Kineto layout (see the module's comment)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(legacy, "truth.json")) as f:
        truth = json.load(f)
    host = socket.gethostname().split(".")[0] or "host"
    for r in range(2):
        with open(os.path.join(legacy, f"rank{r}_trace.json")) as f:
            events = json.load(f)
        # Kineto's ts: microseconds after baseTimeNanoseconds, one wall clock for every rank.
        base_ns = int(truth["clock_offset_us"][0] * 1000) // 1000000 * 1000000
        shift_us = truth["clock_offset_us"][r] - base_ns / 1000.0
        pid = 4000 + r
        kineto = []
        for e in events:
            name = e["name"]
            annotation = name.startswith("PP:") or name.startswith("ProfilerStep#") or name.startswith("Optimizer.")
            kineto.append({"ph": "X", "cat": "user_annotation" if annotation else "cpu_op", "name": name,
                           "pid": pid, "tid": pid, "ts": round(e["ts"] + shift_us, 3), "dur": e["dur"],
                           "args": {"External id": len(kineto) + 1}})
        trace = {"schemaVersion": 1, "deviceProperties": [],
                 "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2},
                 "traceEvents": kineto, "traceName": f"{host}_{pid}.pt.trace.json",
                 "baseTimeNanoseconds": base_ns}
        name = f"{host}_{pid}.{base_ns + r}.pt.trace.json.gz"
        with gzip.open(os.path.join(out, name), "wt", compresslevel=9) as f:
            f.write(json.dumps(trace, separators=(",", ":")))
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
        f.write("\n")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "traces")
    record(os.path.join(root, "torch-1f1b"), "1f1b", PORT)
    record(os.path.join(root, "torch-gpipe"), "gpipe", PORT + 1)
    kineto_copy(os.path.join(root, "torch-1f1b"), os.path.join(root, "kineto-1f1b"))


if __name__ == "__main__":
    main()
