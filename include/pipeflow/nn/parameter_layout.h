#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/nn/model_config.h"
#include "pipeflow/tensor/shape.h"

namespace pipeflow::nn {

// One parameter tensor of a stage: its Hugging Face name, shape (GPT-2's
// weights in Conv1D layout [in, out], Llama's in nn.Linear layout [out, in],
// as each family's checkpoints hold them), where it starts in the stage's one
// contiguous buffer, and whether AdamW decays it.
struct ParameterInfo {
  std::string name;
  Shape shape;
  std::int64_t offset = 0;
  // nanoGPT's convention: 2-D tensors (embeddings, a block's weight
  // matrices, an untied LM head) decay; biases and norm gains do not.
  bool decay = false;

  std::int64_t numel() const { return shape.numel(); }
};

// The parameters of a range of pipeline layers, in model order. GPT-2:
//   embedding: wte.weight [V, C], wpe.weight [context, C]
//   block i:   h.i.ln_1.{weight,bias} [C], h.i.attn.c_attn.weight [C, 3C],
//              h.i.attn.c_attn.bias [3C], h.i.attn.c_proj.weight [C, C],
//              h.i.attn.c_proj.bias [C], h.i.ln_2.{weight,bias} [C],
//              h.i.mlp.c_fc.weight [C, 4C], h.i.mlp.c_fc.bias [4C],
//              h.i.mlp.c_proj.weight [4C, C], h.i.mlp.c_proj.bias [C]
//   head:      ln_f.{weight,bias} [C], then wte.weight unless the range also
//              holds the embedding (the LM head is tied to wte: a head stage
//              without the embedding holds its own copy).
// Llama (KVW = KV·hs):
//   embedding: model.embed_tokens.weight [V, C]
//   block i:   model.layers.i.input_layernorm.weight [C],
//              model.layers.i.self_attn.{q_proj [C, C], k_proj [KVW, C],
//              v_proj [KVW, C], o_proj [C, C]}.weight,
//              model.layers.i.post_attention_layernorm.weight [C],
//              model.layers.i.mlp.{gate_proj [F, C], up_proj [F, C],
//              down_proj [C, F]}.weight
//   head:      model.norm.weight [C], then lm_head.weight [V, C] when
//              untied, else model.embed_tokens.weight unless the range also
//              holds the embedding.
// Each tensor starts at a multiple of 16 elements (64 bytes).
class ParameterLayout {
 public:
  ParameterLayout(const ModelConfig& config, LayerRange range);

  const std::vector<ParameterInfo>& entries() const { return entries_; }
  // nullptr when the range holds no such tensor.
  const ParameterInfo* find(std::string_view name) const;
  // Throws Error naming the tensor and the range when absent.
  const ParameterInfo& at(std::string_view name) const;
  // Elements of the buffer, padding included.
  std::int64_t total() const { return total_; }

 private:
  void add(std::string name, Shape shape, bool decay);
  void add_llama(const ModelConfig& config, LayerRange range);

  std::vector<ParameterInfo> entries_;
  std::int64_t total_ = 0;
  std::string range_name_;
};

// Initial values. GPT-2 (Radford et al. 2019; as nanoGPT): weights
// N(0, 0.02), the residual projections attn.c_proj and mlp.c_proj
// N(0, 0.02/√(2L)), biases 0, LayerNorm gains 1. Llama (as Hugging Face's
// initializer_range): every matrix N(0, 0.02), RMSNorm gains 1. Each tensor
// draws from its own generator seeded by (seed, name), so a stage
// initialises exactly the values the whole model would have in that range,
// however the model is cut.
template <class T>
void init_parameters(const ParameterLayout& layout, const ModelConfig& config, std::uint64_t seed,
                     std::span<T> values);

}  // namespace pipeflow::nn
