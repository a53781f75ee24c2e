#!/usr/bin/python3
"""Writes tests/data/hf/tiny-llama-bf16/: a tiny Llama checkpoint as Hugging Face publishes one -- a
config.json of LlamaForCausalLM (rope_scaling llama3, grouped-query attention, tied embeddings) beside a
model.safetensors of BF16 tensors in Hugging Face's names with no pipeflow metadata -- and expected.json: the
greedy continuation of a prompt that PyTorch computes from those bf16 weights in float64, for pipeflow's
tests to load the checkpoint as it is and generate the same tokens (CI never runs this script). Beside it,
tiny-llama-bf16-sharded/: the same tensors as Hugging Face's save_pretrained shards a checkpoint past its
max_shard_size -- model-0000K-of-0000N.safetensors files, tensors in order, a shard closed once it passes its
share of the bytes, and model.safetensors.index.json mapping every tensor to its shard with the total size.

    /usr/bin/python3 tools/make_hf_llama_checkpoint.py [hf-data-dir]
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
SHARDS = 2


def write_config(folder):
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")


def write_sharded(folder, tensors):
    """tensors in SHARDS files of about equal bytes, in order, and the index that maps them."""
    os.makedirs(folder, exist_ok=True)
    sizes = {name: t.numel() * t.element_size() for name, t in tensors.items()}
    total = sum(sizes.values())
    shards, current, held = [], {}, 0
    for name, tensor in tensors.items():
        current[name] = tensor
        held += sizes[name]
        if held * SHARDS >= total * (len(shards) + 1) and len(shards) < SHARDS - 1:
            shards.append(current)
            current = {}
    shards.append(current)
    weight_map = {}
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05}-of-{len(shards):05}.safetensors"
        safetensors_io.save(os.path.join(folder, file), shard, {"format": "pt"})
        weight_map.update({name: file for name in shard})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    write_config(folder)


def main():
    data = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hf")
    out = os.path.join(data, "tiny-llama-bf16")
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
    write_config(out)
    write_sharded(os.path.join(data, "tiny-llama-bf16-sharded"), tensors)
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
