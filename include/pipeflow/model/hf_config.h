#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

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
//          GPT2Config); activation_function (default "gelu_new") and
//          layer_norm_epsilon (default 1e-5), kept for the runtime to
//          refuse what it does not compute (the counts do not change).
//   llama: num_hidden_layers, hidden_size, num_attention_heads,
//          intermediate_size, vocab_size (required); num_key_value_heads
//          (default num_attention_heads); max_position_embeddings (default
//          2048); tie_word_embeddings (default false); attention_dropout
//          (default 0); head_dim (must be hidden_size / num_attention_heads);
//          attention_bias and mlp_bias (must be false).
// Every other key (token ids, epsilons, rope settings, "architectures",
// "id2label", "task_specific_params", keys of older transformers versions
// such as gpt2-medium's "n_special", ...) is accepted and ignored, so a real
// config.json reads as it is, except a likely misspelling of the family's
// keys above (at most 2 edits from one, e.g. "n_layers",
// "num_hidden_layer"), which is an error with a "did you mean": a misspelt
// shape key would otherwise silently take its default. Without a family,
// both families' keys count. The spec's name is `name`.
//   llava: a vision-language model (ModelSpec::vision): text_config (gpt2
//          or llama, default llama) and vision_config (clip_vision_model:
//          num_hidden_layers, hidden_size, num_attention_heads,
//          intermediate_size, image_size, patch_size, num_channels;
//          hidden_act, default "quick_gelu", and layer_norm_eps, default
//          1e-5, kept as activation_function above), each
//          key a nested config leaves out taking transformers' default of
//          its class (LlamaConfig, GPT2Config, CLIPVisionConfig);
//          vision_feature_layer (default -2: the tower runs up to that
//          layer's output, here 23 of 24 blocks), vision_feature_select_strategy
//          ("default" drops CLS, "full"), image_seq_length (checked),
//          projector_hidden_act (default "gelu"; kept as hidden_act),
//          multimodal_projector_bias (true).
//          A standalone clip_vision_model config is refused: no language model.
ModelSpec model_from_hf_config_text(std::string_view json_text, std::string name);
// A Llama spec as the config.json keys above (model_type "llama"), which
// model_from_hf_config_text reads back to the same spec.
nlohmann::json llama_hf_config(const ModelSpec& spec);
ModelSpec model_from_hf_config(const std::filesystem::path& path);

}  // namespace pipeflow
