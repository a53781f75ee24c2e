#!/usr/bin/python3
"""Writes tests/data/llama_reference.safetensors: what PyTorch computes in float64 for a tiny Llama
(grouped-query attention, Llama 3 rope_scaling, untied LM head), for pipeflow's C++ tests to compare
against (run with Debian's python3-torch; CI never runs it).

The initial weights are drawn in float32 and the model then runs in float64, so the file's float32
weights are exactly the weights the reference computed with. Contents (Hugging Face Llama names,
nn.Linear layout [out, in]):
  <parameter>        initial weights (N(0, 0.02) matrices, unit norm gains, torch.manual_seed(SEED))
  tokens             int32 [B, T+1]: bytes of the fortunes corpus; inputs [:, :-1], targets [:, 1:]
  logits             [B, T, V] of the initial model
  grad.<parameter>   gradient of the mean cross-entropy
  losses             [STEPS + 1]: the loss before each of STEPS AdamW steps on the same batch, and after the last
__metadata__: the model as pipeflow's weights files describe it (model_type llama, ...), the loss, and the
AdamW hyperparameters (decay on 2-D tensors only, global gradient-norm clipping before each step).

    /usr/bin/python3 tools/make_llama_reference.py [out.safetensors]
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_torch import Llama  # noqa: E402
from gpt2_torch import adamw_losses, corpus_batch  # noqa: E402
import safetensors_io  # noqa: E402

SEED = 4321
CONFIG = dict(vocab_size=256, n_ctx=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48,
              rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
# Llama 3's rule at a scale where it matters for T = 16 and head size 8: the
# first frequency is blended, the others stretched.
ROPE_SCALING = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16)
BATCH = 4
ADAMW = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
STEPS = 5


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "llama_reference.safetensors")
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    c = CONFIG
    model = Llama(c["vocab_size"], c["n_ctx"], c["n_layer"], c["n_head"], c["n_kv_head"], c["n_embd"],
                  c["intermediate_size"], c["rope_theta"], ROPE_SCALING, c["rms_norm_eps"],
                  c["tie_word_embeddings"])
    tensors = {name: p.detach().clone() for name, p in model.named_parameters()}  # float32
    model.double()
    tokens = corpus_batch(CONFIG["n_ctx"], BATCH, 7)
    inputs, targets = tokens[:, :-1].long(), tokens[:, 1:].long()
    tensors["tokens"] = tokens
    with torch.no_grad():
        tensors["logits"] = model.logits(inputs).float()
    loss = model(inputs, targets)
    loss.backward()
    for name, p in model.named_parameters():
        tensors["grad." + name] = p.grad.detach().float()

    losses = adamw_losses(model, inputs, targets, ADAMW, STEPS)
    tensors["losses"] = torch.tensor(losses, dtype=torch.float32)

    metadata = {"model_type": "llama", "n_layer": c["n_layer"], "n_head": c["n_head"], "n_embd": c["n_embd"],
                "n_ctx": c["n_ctx"], "vocab_size": c["vocab_size"], "n_kv_head": c["n_kv_head"],
                "intermediate_size": c["intermediate_size"], "rope_theta": repr(c["rope_theta"]),
                "rms_norm_eps": repr(c["rms_norm_eps"]),
                "tie_word_embeddings": "true" if c["tie_word_embeddings"] else "false",
                "rope_scaling.factor": repr(ROPE_SCALING["factor"]),
                "rope_scaling.low_freq_factor": repr(ROPE_SCALING["low_freq_factor"]),
                "rope_scaling.high_freq_factor": repr(ROPE_SCALING["high_freq_factor"]),
                "rope_scaling.original_max_position_embeddings": ROPE_SCALING["original_max_position_embeddings"]}
    metadata.update({"adamw_" + key: repr(value) for key, value in ADAMW.items()})
    metadata.update({"loss": repr(loss.item()), "steps": STEPS, "seed": SEED, "batch": BATCH,
                     "adamw_decay": "2-D tensors only (embeddings, weight matrices, lm_head)",
                     "precision": "float64 (weights drawn in float32)",
                     "torch": torch.__version__,
                     "generator": "tools/make_llama_reference.py"})
    safetensors_io.save(out, tensors, metadata)
    print(f"wrote {out}: loss {loss.item():.9f}, losses {['%.6f' % x for x in losses]}")


if __name__ == "__main__":
    main()
