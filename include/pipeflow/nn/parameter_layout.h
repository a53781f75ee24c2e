#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/nn/gpt_config.h"
#include "pipeflow/tensor/shape.h"

namespace pipeflow::nn {

// One parameter tensor of a stage: its Hugging Face GPT-2 name, shape
// (weights in Conv1D layout [in, out]), where it starts in the stage's one
// contiguous buffer, and whether AdamW decays it.
struct ParameterInfo {
  std::string name;
  Shape shape;
  std::int64_t offset = 0;
  // nanoGPT's convention: 2-D tensors (wte, wpe, the four weight matrices of a
  // block) decay; biases and LayerNorm gains do not.
  bool decay = false;

  std::int64_t numel() const { return shape.numel(); }
};

// The parameters of a range of pipeline layers, in model order:
//   embedding: wte.weight [V, C], wpe.weight [context, C]
//   block i:   h.i.ln_1.{weight,bias} [C], h.i.attn.c_attn.weight [C, 3C],
//              h.i.attn.c_attn.bias [3C], h.i.attn.c_proj.weight [C, C],
//              h.i.attn.c_proj.bias [C], h.i.ln_2.{weight,bias} [C],
//              h.i.mlp.c_fc.weight [C, 4C], h.i.mlp.c_fc.bias [4C],
//              h.i.mlp.c_proj.weight [4C, C], h.i.mlp.c_proj.bias [C]
//   head:      ln_f.{weight,bias} [C], then wte.weight unless the range also
//              holds the embedding (the LM head is tied to wte: a head stage
//              without the embedding holds its own copy).
// Each tensor starts at a multiple of 16 elements (64 bytes).
class ParameterLayout {
 public:
  ParameterLayout(const GptConfig& config, LayerRange range);

  const std::vector<ParameterInfo>& entries() const { return entries_; }
  // nullptr when the range holds no such tensor.
  const ParameterInfo* find(std::string_view name) const;
  // Throws Error naming the tensor and the range when absent.
  const ParameterInfo& at(std::string_view name) const;
  // Elements of the buffer, padding included.
  std::int64_t total() const { return total_; }

 private:
  void add(std::string name, Shape shape, bool decay);

  std::vector<ParameterInfo> entries_;
  std::int64_t total_ = 0;
  std::string range_name_;
};

// GPT-2's initialisation (Radford et al. 2019; as nanoGPT): weights N(0, 0.02),
// the residual projections attn.c_proj and mlp.c_proj N(0, 0.02/√(2L)), biases
// 0, LayerNorm gains 1. Each tensor draws from its own generator seeded by
// (seed, name), so a stage initialises exactly the values the whole model
// would have in that range, however the model is cut.
template <class T>
void init_gpt2(const ParameterLayout& layout, int n_layer, std::uint64_t seed, std::span<T> values);

}  // namespace pipeflow::nn
