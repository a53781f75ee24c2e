#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "pipeflow/nn/model_config.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/nn/stage.h"

namespace pipeflow::nn {

// Weights in safetensors with Hugging Face's names of the model's family
// (GPT-2: wte.weight, h.{i}.attn.c_attn.weight in Conv1D layout [in, out];
// Llama: model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight
// in nn.Linear layout [out, in]; see parameter_layout.h), and the model in
// __metadata__ as n_layer, n_head, n_embd, n_ctx and vocab_size; a Llama adds
// model_type "llama", n_kv_head, intermediate_size, rope_theta, rms_norm_eps,
// tie_word_embeddings and rope_scaling.{factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings}. Weights move between
// pipeflow and other implementations by name.

// The __metadata__ keys and values that describe `config`.
std::map<std::string, std::string> config_metadata(const ModelConfig& config);
void write_config(SafetensorsWriter& writer, const ModelConfig& config);
// Error naming the file and the missing or malformed key.
ModelConfig read_config(const SafetensorsFile& file);

// Adds every parameter (or gradient) tensor of the stage under its name.
void add_parameters(SafetensorsWriter& writer, const Stage& stage);
void add_gradients(SafetensorsWriter& writer, const Stage& stage);

// Fills every parameter of the stage from the tensor of the same name (shape
// checked). Tensors the stage does not hold are ignored (other stages' layers,
// HF's attention-mask buffers); a missing one is an Error naming it.
void load_parameters(Stage& stage, const SafetensorsFile& file);

// A weights file or checkpoint holding a NaN or Inf would train on silently
// into NaN, and a negative second moment makes AdamW's square root NaN: an
// Error naming the file, the tensor and the index of the first such value
// (F32 tensors; exp_avg_sq.* must also be >= 0).
void check_values(const SafetensorsFile& file);

// A tensor the model of `config` does not take, though its name is one of
// the model family's parameters at some layer or head (h.5.ln_1.weight,
// model.layers.5.mlp.up_proj.weight, an untied Llama's lm_head.weight), or
// such a parameter's AdamW moment (exp_avg.*, exp_avg_sq.*) or gradient
// (grad.*): loading would drop it silently, so the file holds another model
// or its metadata is wrong. An Error naming the file, the first such tensor
// (in file order) and the model. Names of no parameter (a reference file's
// tokens and logits, Hugging Face's attention-mask buffers) pass.
void check_tensors_taken(const SafetensorsFile& file, const ModelConfig& config);

// A whole-model weights file: config in the metadata plus every parameter,
// and "precision": what the weights were trained in (fp32, bf16, fp16; they
// are the fp32 master weights either way).
void write_weights(const std::filesystem::path& path, const Stage& stage,
                   ComputeFormat trained_in = ComputeFormat::kFp32);

}  // namespace pipeflow::nn
