#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "pipeflow/model/model_spec.h"

namespace pipeflow {

// Reads the shape of a model from a Hugging Face config.json.
//
// The family is chosen by "model_type" ("gpt2" or "llama"); without it, by
// the keys present ("n_layer" → gpt2, "num_hidden_layers" → llama).
//   gpt2:  n_layer, n_embd, n_head, vocab_size (required); n_inner (null or
//          absent → 4·n_embd); n_positions (else n_ctx, else 1024);
//          tie_word_embeddings (default true); dropout from attn_pdrop,
//          resid_pdrop, embd_pdrop (default 0.1 each, as transformers'
//          GPT2Config).
//   llama: num_hidden_layers, hidden_size, num_attention_heads,
//          intermediate_size, vocab_size (required); num_key_value_heads
//          (default num_attention_heads); max_position_embeddings (default
//          2048); tie_word_embeddings (default false); attention_dropout
//          (default 0); head_dim (must be hidden_size / num_attention_heads);
//          attention_bias and mlp_bias (must be false).
// Keys that do not change the shape (token ids, epsilons, rope settings,
// activation names, "architectures", "torch_dtype", ...) are accepted and
// ignored; any other key is an error naming it (a misspelt shape key would
// otherwise silently take its default). The spec's name is `name`.
ModelSpec model_from_hf_config_text(std::string_view json_text, std::string name);
ModelSpec model_from_hf_config(const std::filesystem::path& path);

}  // namespace pipeflow
