"""The PyTorch side of bench/train_step.sh: one training step (forward + backward + AdamW) of the same GPT-2
(tools/gpt2_torch.py) or Llama (tools/llama_torch.py, with --arch llama --kv-heads KV --intermediate F) on
one thread, timed like bench_train_step (wall clock and process CPU time per
step), with the same FLOP count.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 bench/train_step_torch.py \
        --layers L --heads H --width C --context T --batch B --steps N

One thread means OPENBLAS_NUM_THREADS=1 too: Debian's torch multiplies through OpenBLAS, whose own thread
pool torch.set_num_threads does not limit.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from gpt2_torch import Gpt2, decay_groups  # noqa: E402
from llama_torch import Llama  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    for name, default in [("layers", 4), ("heads", 4), ("width", 128), ("context", 64), ("batch", 16),
                          ("steps", 10), ("vocab", 256), ("kv-heads", 0), ("intermediate", 0)]:
        parser.add_argument("--" + name, type=int, default=default)
    parser.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--format", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: torch.autocast('cpu', dtype=torch.bfloat16) around the forward")
    o = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    llama = o.arch == "llama"
    kv_heads = o.kv_heads or o.heads
    ffn = o.intermediate or 4 * o.width
    if llama:
        model = Llama(o.vocab, o.context, o.layers, o.heads, kv_heads, o.width, ffn, 10000.0, {"factor": 1}, 1e-5,
                      True)
    else:
        model = Gpt2(o.vocab, o.context, o.layers, o.heads, o.width)
    decay, no_decay = decay_groups(model)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-4)
    tokens = torch.randint(0, o.vocab, (o.batch, o.context))
    targets = torch.randint(0, o.vocab, (o.batch, o.context))

    autocast = o.format == "bf16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(tokens, targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    step()
    wall, cpu = [], []
    for _ in range(o.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = step()
        cpu.append(time.process_time() - cpu_start)
        wall.append(time.perf_counter() - start)
    median = sorted(wall)[len(wall) // 2]
    cpu_median = sorted(cpu)[len(cpu) // 2]
    b, l, t, c, v = o.batch, o.layers, o.context, o.width, o.vocab
    if llama:
        kv = kv_heads * (c // o.heads)
        flops = 3 * b * t * (l * (2 * (2 * c * c + 2 * c * kv + 3 * c * ffn) + 4 * t * c) + 2 * c * v)
    else:
        flops = 72 * b * l * t * c * c * (1 + t / (6 * c) + v / (12 * c * l))
    name = ("torch-llama" if llama else "torch") + ("-bf16" if autocast else "")
    print(f"{name}: {median * 1e3:.2f} ms/step (median of {o.steps}, min {min(wall) * 1e3:.2f}, "
          f"max {max(wall) * 1e3:.2f}), "
          f"cpu {cpu_median * 1e3:.2f} ms/step, {flops / cpu_median / 1e9:.1f} GFLOP/s, {flops / 1e9:.3f} GFLOP/step, "
          f"loss {loss:.4f}, torch {torch.__version__}, threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
