#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipeflow::nn {

// The decoder families nn trains and serves.
//   kGpt2:  learned position table, LayerNorm with bias, biased Conv1D
//           layers [in, out], GELU MLP of 4·C, multi-head attention, the LM
//           head tied to wte.
//   kLlama: rotary positions, RMSNorm (weight only), nn.Linear layers
//           [out, in] without bias, SwiGLU MLP of `intermediate`,
//           grouped-query attention (n_kv_head heads for K and V), the LM
//           head tied or its own lm_head.weight.
enum class Family { kGpt2, kLlama };

const char* to_string(Family family);

// Llama 3's rope_scaling ("rope_type": "llama3"): wavelengths longer than
// original_context / low_freq_factor are stretched by `factor`, those shorter
// than original_context / high_freq_factor kept, those between blended.
// factor 1 (the default) is no scaling, as Llama 2 has.
struct RopeScaling {
  double factor = 1;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int original_context = 8192;
  bool operator==(const RopeScaling&) const = default;
};

// The shape of a model. Dimension letters used across nn: B sequences in a
// micro-batch, T positions (T <= context), C = n_embd, NH = n_head,
// hs = C / NH, KV = n_kv_head, F = MLP width, V = vocab_size, L = n_layer.
struct ModelConfig {
  Family family = Family::kGpt2;
  int vocab_size = 256;  // byte-level by default
  int context = 64;      // block size: the most positions a sequence may have (n_ctx)
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  // Llama only (GPT-2 fixes them: KV = NH, F = 4C, tied, LayerNorm ε 1e-5).
  int n_kv_head = 0;     // 0: n_head (multi-head attention)
  int intermediate = 0;  // 0: 4·n_embd
  double rope_theta = 10000;
  RopeScaling rope_scaling = {};
  double norm_eps = 1e-5;
  bool tied_embeddings = true;

  // Upper bounds that keep every parameter count and tensor size within 64
  // bits (GPT-3 175B has n_embd 12288, 96 layers, context 2048, vocabulary 50257).
  static constexpr int kMaxVocab = 1 << 24;
  static constexpr int kMaxContext = 1 << 20;
  static constexpr int kMaxLayers = 1 << 12;
  static constexpr int kMaxWidth = 1 << 16;

  // Throws Error naming the field, its value and the rule: each field in
  // [1, its kMax], n_embd a multiple of n_head, n_head a multiple of
  // n_kv_head, an even head size for Llama's rotations, GPT-2's fixed fields
  // at their values.
  void validate() const;
  bool llama() const { return family == Family::kLlama; }
  int kv_heads() const { return n_kv_head == 0 ? n_head : n_kv_head; }
  int head_size() const { return n_embd / n_head; }
  int ffn() const { return intermediate == 0 ? 4 * n_embd : intermediate; }
  // The pipeline layers: embedding, block.0 … block.{L−1}, head.
  int pipeline_layers() const { return n_layer + 2; }
  // The token embedding's tensor name ("wte.weight", "model.embed_tokens.weight").
  const char* embedding_name() const;
  // The LM head's matrix [V, C]: the embedding's when tied, else "lm_head.weight".
  const char* head_matrix_name() const;
  // Parameters counted once (a tied LM head shares the embedding). GPT-2:
  // V·C + T·C + L·(12C² + 13C) + 2C.
  std::int64_t parameter_count() const;
  // The same model: the same fields, n_kv_head and intermediate compared by
  // what they mean (0 and n_head are one value, as are 0 and 4·n_embd).
  bool operator==(const ModelConfig& other) const;
};

// Throws Error unless the model splits over `size` tensor-parallel ranks as
// Megatron-LM splits it: n_head, the key/value heads, the MLP width and the
// vocabulary each a multiple of `size` (size >= 1).
void validate_tensor_parallel(const ModelConfig& config, int size);

// One line for reports and errors: "GPT-2, 4 layers, width 128, 4 heads,
// context 64, vocabulary 256" or "Llama, 4 layers, width 128, 4 heads (2
// key/value), MLP 344, context 64, vocabulary 256, rope_theta 10000,
// rms_norm_eps 1e-05, untied head" (with rope scaling when set): every field
// operator== compares.
std::string describe(const ModelConfig& config);

// Llama's rotation frequencies f_i = rope_theta^(−2i/hs), i < hs/2, with
// rope_scaling applied (Llama 3's llama3 rule; unchanged when factor is 1).
std::vector<double> rope_frequencies(const ModelConfig& config);

// A contiguous range [first, last) of pipeline layers, 0 = embedding,
// 1 … L = blocks, L + 1 = head: what one pipeline stage holds.
struct LayerRange {
  int first = 0;
  int last = 0;
  int size() const { return last - first; }
  bool operator==(const LayerRange&) const = default;
};

// The whole model as one range.
inline LayerRange all_layers(const ModelConfig& config) { return {0, config.pipeline_layers()}; }

// "embedding", "block.3", "head".
std::string pipeline_layer_name(const ModelConfig& config, int layer);

// Throws Error unless range is a non-empty range inside [0, L + 2).
void validate_range(const ModelConfig& config, LayerRange range);

}  // namespace pipeflow::nn
