#!/usr/bin/python3
"""Writes tests/data/hf/tiny-llama-bf16/: a tiny Llama checkpoint as Hugging Face publishes one -- a
config.json of LlamaForCausalLM (rope_scaling llama3, grouped-query attention, tied embeddings) beside a
model.safetensors of BF16 tensors in Hugging Face's names with no pipeflow metadata -- and expected.json: the
greedy continuation of a prompt that PyTorch computes from those bf16 weights in float64, for pipeflow's
tests to load the checkpoint as it is and generate the same tokens (CI never runs this script).

    /usr/bin/python3 tools/make_hf_llama_checkpoint.py [out-dir]
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_torch import Llama  # noqa: E402
import safetensors_io  # noqa: E402

SEED = 77
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 160,
    "max_position_embeddings": 64,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 32, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0",
    "use_cache": True,
    "vocab_size": 256,
}
PROMPT = b"The cat"
NEW_TOKENS = 12


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hf", "tiny-llama-bf16")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    c = CONFIG
    scaling = dict(c["rope_scaling"])
    model = Llama(c["vocab_size"], c["max_position_embeddings"], c["num_hidden_layers"], c["num_attention_heads"],
                  c["num_key_value_heads"], c["hidden_size"], c["intermediate_size"], c["rope_theta"], scaling,
                  c["rms_norm_eps"], c["tie_word_embeddings"])
    # Larger weights than the initialisation, so that the greedy tokens depend on every layer.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    tensors = {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()}
    safetensors_io.save(os.path.join(out, "model.safetensors"), tensors, {})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    # The reference computes in float64 from exactly the bf16 values.
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name].float())
    model.double()
    tokens = list(PROMPT)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model.logits(torch.tensor([tokens]))
            tokens.append(int(logits[0, -1].argmax()))
    expected = {"prompt": PROMPT.decode(), "new_tokens": tokens[len(PROMPT):],
                "generator": "tools/make_hf_llama_checkpoint.py", "torch": torch.__version__}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")
    print(f"wrote {out}: greedy continuation {tokens[len(PROMPT):]}")


if __name__ == "__main__":
    main()
