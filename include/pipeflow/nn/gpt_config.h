#pragma once

#include <cstdint>
#include <string>

namespace pipeflow::nn {

// The shape of a GPT-2 model. Dimension letters used across nn: B sequences
// in a micro-batch, T positions (T <= context), C = n_embd, NH = n_head,
// hs = C / NH, V = vocab_size, L = n_layer.
struct GptConfig {
  int vocab_size = 256;  // byte-level by default
  int context = 64;      // block size: the most positions a sequence may have (n_ctx)
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;

  // Upper bounds that keep every parameter count and tensor size within 64
  // bits (GPT-3 175B has n_embd 12288, 96 layers, context 2048, vocabulary 50257).
  static constexpr int kMaxVocab = 1 << 24;
  static constexpr int kMaxContext = 1 << 20;
  static constexpr int kMaxLayers = 1 << 12;
  static constexpr int kMaxWidth = 1 << 16;

  // Throws Error naming the field, its value and the rule: each field in
  // [1, its kMax], n_embd a multiple of n_head.
  void validate() const;
  // The pipeline layers: embedding, block.0 … block.{L−1}, head.
  int pipeline_layers() const { return n_layer + 2; }
  // Parameters counted once (the LM head shares wte):
  // V·C + T·C + L·(12C² + 13C) + 2C.
  std::int64_t parameter_count() const;
  bool operator==(const GptConfig&) const = default;
};

// A contiguous range [first, last) of pipeline layers, 0 = embedding,
// 1 … L = blocks, L + 1 = head: what one pipeline stage holds.
struct LayerRange {
  int first = 0;
  int last = 0;
  int size() const { return last - first; }
  bool operator==(const LayerRange&) const = default;
};

// The whole model as one range.
inline LayerRange all_layers(const GptConfig& config) { return {0, config.pipeline_layers()}; }

// "embedding", "block.3", "head".
std::string pipeline_layer_name(const GptConfig& config, int layer);

// Throws Error unless range is a non-empty range inside [0, L + 2).
void validate_range(const GptConfig& config, LayerRange range);

}  // namespace pipeflow::nn
