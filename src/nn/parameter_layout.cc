#include "pipeflow/nn/parameter_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/random.h"

namespace pipeflow::nn {
namespace {

constexpr std::int64_t kAlignElements = 16;

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

}  // namespace

ParameterLayout::ParameterLayout(const ModelConfig& config, LayerRange range) {
  config.validate();
  validate_range(config, range);
  range_name_ = fmt::format("layers {}..{}", pipeline_layer_name(config, range.first),
                            pipeline_layer_name(config, range.last - 1));
  const std::int64_t c = config.n_embd;
  const bool has_embedding = range.first == 0;
  if (config.llama()) {
    add_llama(config, range);
    return;
  }
  if (has_embedding) {
    add("wte.weight", {config.vocab_size, c}, true);
    add("wpe.weight", {config.context, c}, true);
  }
  for (int layer = std::max(range.first, 1); layer < std::min(range.last, config.n_layer + 1); ++layer) {
    const std::string p = fmt::format("h.{}.", layer - 1);
    add(p + "ln_1.weight", {c}, false);
    add(p + "ln_1.bias", {c}, false);
    add(p + "attn.c_attn.weight", {c, 3 * c}, true);
    add(p + "attn.c_attn.bias", {3 * c}, false);
    add(p + "attn.c_proj.weight", {c, c}, true);
    add(p + "attn.c_proj.bias", {c}, false);
    add(p + "ln_2.weight", {c}, false);
    add(p + "ln_2.bias", {c}, false);
    add(p + "mlp.c_fc.weight", {c, 4 * c}, true);
    add(p + "mlp.c_fc.bias", {4 * c}, false);
    add(p + "mlp.c_proj.weight", {4 * c, c}, true);
    add(p + "mlp.c_proj.bias", {c}, false);
  }
  if (range.last == config.pipeline_layers()) {
    add("ln_f.weight", {c}, false);
    add("ln_f.bias", {c}, false);
    if (!has_embedding) add("wte.weight", {config.vocab_size, c}, true);
  }
}

void ParameterLayout::add_llama(const ModelConfig& config, LayerRange range) {
  const std::int64_t c = config.n_embd;
  const std::int64_t kv = static_cast<std::int64_t>(config.kv_heads()) * config.head_size();
  const std::int64_t f = config.ffn();
  const bool has_embedding = range.first == 0;
  if (has_embedding) add(config.embedding_name(), {config.vocab_size, c}, true);
  for (int layer = std::max(range.first, 1); layer < std::min(range.last, config.n_layer + 1); ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer - 1);
    add(p + "input_layernorm.weight", {c}, false);
    add(p + "self_attn.q_proj.weight", {c, c}, true);
    add(p + "self_attn.k_proj.weight", {kv, c}, true);
    add(p + "self_attn.v_proj.weight", {kv, c}, true);
    add(p + "self_attn.o_proj.weight", {c, c}, true);
    add(p + "post_attention_layernorm.weight", {c}, false);
    add(p + "mlp.gate_proj.weight", {f, c}, true);
    add(p + "mlp.up_proj.weight", {f, c}, true);
    add(p + "mlp.down_proj.weight", {c, f}, true);
  }
  if (range.last == config.pipeline_layers()) {
    add("model.norm.weight", {c}, false);
    if (!config.tied_embeddings || !has_embedding) add(config.head_matrix_name(), {config.vocab_size, c}, true);
  }
}

void ParameterLayout::add(std::string name, Shape shape, bool decay) {
  entries_.push_back({std::move(name), shape, total_, decay});
  total_ += (shape.numel() + kAlignElements - 1) / kAlignElements * kAlignElements;
}

const ParameterInfo* ParameterLayout::find(std::string_view name) const {
  const auto found = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.name == name; });
  return found == entries_.end() ? nullptr : &*found;
}

const ParameterInfo& ParameterLayout::at(std::string_view name) const {
  const ParameterInfo* info = find(name);
  if (info == nullptr) fail("no parameter {} in {}", name, range_name_);
  return *info;
}

template <class T>
void init_parameters(const ParameterLayout& layout, const ModelConfig& config, std::uint64_t seed,
                     std::span<T> values) {
  const double residual_std = 0.02 / std::sqrt(2.0 * config.n_layer);
  for (const ParameterInfo& info : layout.entries()) {
    T* first = values.data() + info.offset;
    T* last = first + info.numel();
    if (ends_with(info.name, ".bias")) {
      std::fill(first, last, T(0));
    } else if (info.shape.rank() == 1) {  // a norm's gain
      std::fill(first, last, T(1));
    } else {
      const double std = ends_with(info.name, "c_proj.weight") ? residual_std : 0.02;
      Rng rng(derive_seed(seed, hash_name(info.name)));
      for (T* value = first; value != last; ++value) *value = static_cast<T>(std * rng.normal());
    }
  }
}

template void init_parameters<float>(const ParameterLayout&, const ModelConfig&, std::uint64_t, std::span<float>);
template void init_parameters<double>(const ParameterLayout&, const ModelConfig&, std::uint64_t,
                                      std::span<double>);

}  // namespace pipeflow::nn
