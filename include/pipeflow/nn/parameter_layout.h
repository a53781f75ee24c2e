#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeflow/nn/model_config.h"
#include "pipeflow/nn/transformer_block.h"
#include "pipeflow/tensor/shape.h"

namespace pipeflow::nn {

// Which part of every split tensor a rank of a tensor-parallel group holds
// (Megatron-LM's tensor parallelism): `size` ranks, this one `rank`.
struct TensorSlice {
  int size = 1;
  int rank = 0;
  bool operator==(const TensorSlice&) const = default;
};

// One parameter tensor of a stage: its Hugging Face name, shape (GPT-2's
// weights in Conv1D layout [in, out], Llama's in nn.Linear layout [out, in],
// as each family's checkpoints hold them), where it starts in the stage's one
// contiguous buffer, and whether AdamW decays it.
//
// Under tensor parallelism a tensor is whole on every rank (replicated: the
// norms, GPT-2's wpe and the biases added after a row-parallel product) or
// split along `split_dim` into slice.size equal parts, rank k holding part
// k. A fused tensor (GPT-2's c_attn, q | k | v along its columns) is
// `chunks` tensors side by side, each split alike, so a rank holds its heads
// of q, of k and of v. `shape` is the rank's part, `whole` the tensor's.
struct ParameterInfo {
  std::string name;
  Shape shape;
  std::int64_t offset = 0;
  // nanoGPT's convention: 2-D tensors (embeddings, a block's weight
  // matrices, an untied LM head) decay; biases and norm gains do not.
  bool decay = false;
  Shape whole;
  int split_dim = -1;  // -1: replicated
  int chunks = 1;
  TensorSlice slice;

  std::int64_t numel() const { return shape.numel(); }
  bool split() const { return split_dim >= 0 && slice.size > 1; }
};

// The rank's part of a whole tensor (whole.numel() values) into `part`
// (info.numel() values), and back; a replicated tensor is copied whole.
template <class T>
void copy_part(const ParameterInfo& info, std::span<const T> whole, std::span<T> part);
template <class T>
void place_part(const ParameterInfo& info, std::span<const T> part, std::span<T> whole);

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
//
// With slice.size > 1, each rank's parts as Megatron-LM splits a block:
// column-parallel (split along the output features) c_attn, c_fc, q_proj,
// k_proj, v_proj, gate_proj, up_proj and their biases; row-parallel (split
// along the input features) attn.c_proj, mlp.c_proj, o_proj, down_proj;
// vocabulary-parallel (split along the rows) wte, embed_tokens, lm_head.
// validate_tensor_parallel says what the model must divide.
class ParameterLayout {
 public:
  ParameterLayout(const ModelConfig& config, LayerRange range, TensorSlice slice = {});
  // An empty layout that `add` and `append` fill (a model that is not one
  // family's stack, e.g. a vision-language model); `name` is what at()'s
  // error calls it.
  explicit ParameterLayout(std::string name) : range_name_(std::move(name)) {}

  // A whole (replicated) tensor after the others, 64-byte aligned.
  void add(std::string name, Shape shape, bool decay) { add(std::move(name), shape, decay, -1, 1); }
  // Every tensor of `other` (whole), its name prefixed.
  void append(const ParameterLayout& other, std::string_view prefix);

  const std::vector<ParameterInfo>& entries() const { return entries_; }
  // nullptr when the range holds no such tensor.
  const ParameterInfo* find(std::string_view name) const;
  // Throws Error naming the tensor and the range when absent.
  const ParameterInfo& at(std::string_view name) const;
  // Elements of the buffer, padding included.
  std::int64_t total() const { return total_; }

 private:
  // split_dim -1: replicated.
  void add(std::string name, Shape shape, bool decay, int split_dim, int chunks = 1);
  void add_llama(const ModelConfig& config, LayerRange range);

  TensorSlice slice_;

  std::vector<ParameterInfo> entries_;
  std::int64_t total_ = 0;
  std::string range_name_;
};

// A GPT-2 block's tensors named `prefix` + "ln_1.weight", ... (prefix
// "h.3." in a GPT-2 model) at their offsets from `base`.
template <class P, class Buffer>
BlockParams<P> gpt2_block_params(const ParameterLayout& layout, const std::string& prefix, Buffer* base) {
  auto at = [&](const char* name) { return base + layout.at(prefix + name).offset; };
  return {.ln_1_weight = at("ln_1.weight"),
          .ln_2_weight = at("ln_2.weight"),
          .ln_1_bias = at("ln_1.bias"),
          .ln_2_bias = at("ln_2.bias"),
          .attn_weight = at("attn.c_attn.weight"),
          .attn_bias = at("attn.c_attn.bias"),
          .attn_proj_weight = at("attn.c_proj.weight"),
          .attn_proj_bias = at("attn.c_proj.bias"),
          .fc_weight = at("mlp.c_fc.weight"),
          .fc_bias = at("mlp.c_fc.bias"),
          .fc_proj_weight = at("mlp.c_proj.weight"),
          .fc_proj_bias = at("mlp.c_proj.bias")};
}

// Initial values. GPT-2 (Radford et al. 2019; as nanoGPT): weights
// N(0, 0.02), the residual projections attn.c_proj and mlp.c_proj
// N(0, 0.02/√(2L)), biases 0, LayerNorm gains 1, a vision encoder's
// class_embedding N(0, 0.02) as the matrices. Llama (as Hugging Face's
// initializer_range): every matrix N(0, 0.02), RMSNorm gains 1. Each tensor
// draws from its own generator seeded by (seed, name), so a stage
// initialises exactly the values the whole model would have in that range,
// however the model is cut (and, of a split tensor, the part of the whole
// tensor's values the rank holds).
template <class T>
void init_parameters(const ParameterLayout& layout, const ModelConfig& config, std::uint64_t seed,
                     std::span<T> values);

}  // namespace pipeflow::nn
