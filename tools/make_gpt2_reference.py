#!/usr/bin/python3
"""Writes tests/data/gpt2_reference.safetensors: what PyTorch computes for a tiny GPT-2, for pipeflow's
C++ tests to compare against (run with Debian's python3-torch; CI never runs it).

Contents (HF GPT-2 names, Conv1D layout [in, out]):
  <parameter>        initial weights (GPT-2 init, torch.manual_seed(SEED))
  tokens             int32 [B, T+1]: bytes of the fortunes corpus; inputs [:, :-1], targets [:, 1:]
  logits             [B, T, V] of the initial model
  grad.<parameter>   gradient of the mean cross-entropy
  losses             [STEPS + 1]: the loss before each of STEPS AdamW steps on the same batch, and after the last
__metadata__: the model shape (n_layer, n_head, n_embd, n_ctx, vocab_size), the loss, and the AdamW
hyperparameters (decay on 2-D tensors only, global gradient-norm clipping before each step).

    /usr/bin/python3 tools/make_gpt2_reference.py [out.safetensors]
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import Gpt2, adamw_losses, corpus_batch  # noqa: E402
import safetensors_io  # noqa: E402

SEED = 1234
CONFIG = dict(vocab_size=256, n_ctx=16, n_layer=2, n_head=4, n_embd=32)
BATCH = 4
ADAMW = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
STEPS = 5


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "gpt2_reference.safetensors")
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    model = Gpt2(CONFIG["vocab_size"], CONFIG["n_ctx"], CONFIG["n_layer"], CONFIG["n_head"], CONFIG["n_embd"])
    tokens = corpus_batch(CONFIG["n_ctx"], BATCH)
    inputs, targets = tokens[:, :-1].long(), tokens[:, 1:].long()

    tensors = {name: p.detach().clone() for name, p in model.named_parameters()}
    tensors["tokens"] = tokens
    with torch.no_grad():
        tensors["logits"] = model.logits(inputs)
    loss = model(inputs, targets)
    loss.backward()
    for name, p in model.named_parameters():
        tensors["grad." + name] = p.grad.detach().clone()

    losses = adamw_losses(model, inputs, targets, ADAMW, STEPS)
    tensors["losses"] = torch.tensor(losses, dtype=torch.float32)

    metadata = {key: value for key, value in CONFIG.items()}
    metadata.update({"adamw_" + key: repr(value) for key, value in ADAMW.items()})
    metadata.update({"loss": repr(loss.item()), "steps": STEPS, "seed": SEED, "batch": BATCH,
                     "adamw_decay": "2-D tensors only (wte, wpe, weight matrices)",
                     "torch": torch.__version__,
                     "generator": "tools/make_gpt2_reference.py"})
    safetensors_io.save(out, tensors, metadata)
    print(f"wrote {out}: loss {loss.item():.6f}, losses {['%.6f' % x for x in losses]}")


if __name__ == "__main__":
    main()
