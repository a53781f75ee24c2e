#include "pipeflow/nn/parameter_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/random.h"

namespace pipeflow::nn {
namespace {

constexpr std::int64_t kAlignElements = 16;

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

}  // namespace

ParameterLayout::ParameterLayout(const ModelConfig& config, LayerRange range, TensorSlice slice) : slice_(slice) {
  config.validate();
  validate_range(config, range);
  validate_tensor_parallel(config, slice.size);
  if (slice.rank < 0 || slice.rank >= slice.size) {
    fail("tensor-parallel rank {} is outside [0, {})", slice.rank, slice.size);
  }
  range_name_ = fmt::format("layers {}..{}", pipeline_layer_name(config, range.first),
                            pipeline_layer_name(config, range.last - 1));
  const std::int64_t c = config.n_embd;
  const bool has_embedding = range.first == 0;
  if (config.llama()) {
    add_llama(config, range);
    return;
  }
  if (has_embedding) {
    add("wte.weight", {config.vocab_size, c}, true, 0);
    add("wpe.weight", {config.context, c}, true);
  }
  for (int layer = std::max(range.first, 1); layer < std::min(range.last, config.n_layer + 1); ++layer) {
    const std::string p = fmt::format("h.{}.", layer - 1);
    add(p + "ln_1.weight", {c}, false);
    add(p + "ln_1.bias", {c}, false);
    add(p + "attn.c_attn.weight", {c, 3 * c}, true, 1, 3);
    add(p + "attn.c_attn.bias", {3 * c}, false, 0, 3);
    add(p + "attn.c_proj.weight", {c, c}, true, 0);
    add(p + "attn.c_proj.bias", {c}, false);
    add(p + "ln_2.weight", {c}, false);
    add(p + "ln_2.bias", {c}, false);
    add(p + "mlp.c_fc.weight", {c, 4 * c}, true, 1);
    add(p + "mlp.c_fc.bias", {4 * c}, false, 0);
    add(p + "mlp.c_proj.weight", {4 * c, c}, true, 0);
    add(p + "mlp.c_proj.bias", {c}, false);
  }
  if (range.last == config.pipeline_layers()) {
    add("ln_f.weight", {c}, false);
    add("ln_f.bias", {c}, false);
    if (!has_embedding) add("wte.weight", {config.vocab_size, c}, true, 0);
  }
}

void ParameterLayout::add_llama(const ModelConfig& config, LayerRange range) {
  const std::int64_t c = config.n_embd;
  const std::int64_t kv = static_cast<std::int64_t>(config.kv_heads()) * config.head_size();
  const std::int64_t f = config.ffn();
  const bool has_embedding = range.first == 0;
  if (has_embedding) add(config.embedding_name(), {config.vocab_size, c}, true, 0);
  for (int layer = std::max(range.first, 1); layer < std::min(range.last, config.n_layer + 1); ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer - 1);
    add(p + "input_layernorm.weight", {c}, false);
    add(p + "self_attn.q_proj.weight", {c, c}, true, 0);
    add(p + "self_attn.k_proj.weight", {kv, c}, true, 0);
    add(p + "self_attn.v_proj.weight", {kv, c}, true, 0);
    add(p + "self_attn.o_proj.weight", {c, c}, true, 1);
    add(p + "post_attention_layernorm.weight", {c}, false);
    add(p + "mlp.gate_proj.weight", {f, c}, true, 0);
    add(p + "mlp.up_proj.weight", {f, c}, true, 0);
    add(p + "mlp.down_proj.weight", {c, f}, true, 1);
  }
  if (range.last == config.pipeline_layers()) {
    add("model.norm.weight", {c}, false);
    if (!config.tied_embeddings || !has_embedding) {
      add(config.head_matrix_name(), {config.vocab_size, c}, true, 0);
    }
  }
}

void ParameterLayout::add(std::string name, Shape whole, bool decay, int split_dim, int chunks) {
  Shape shape = whole;
  if (split_dim >= 0 && slice_.size > 1) {
    const std::int64_t part = whole[split_dim] / slice_.size;
    shape = whole.rank() == 1 ? Shape{part} : split_dim == 0 ? Shape{part, whole[1]} : Shape{whole[0], part};
  }
  entries_.push_back({.name = std::move(name),
                      .shape = shape,
                      .offset = total_,
                      .decay = decay,
                      .whole = whole,
                      .split_dim = split_dim,
                      .chunks = chunks,
                      .slice = slice_});
  total_ += (shape.numel() + kAlignElements - 1) / kAlignElements * kAlignElements;
}

void ParameterLayout::append(const ParameterLayout& other, std::string_view prefix) {
  for (const ParameterInfo& info : other.entries()) add(std::string(prefix) + info.name, info.whole, info.decay);
}

namespace {

// Calls run(whole_offset, part_offset, count) for each contiguous run of the
// rank's part of a split tensor, seen as [rows, columns] (a vector as one row).
template <class Run>
void for_each_run(const ParameterInfo& info, Run run) {
  const bool vector = info.whole.rank() == 1;
  const std::int64_t rows = vector ? 1 : info.whole[0];
  const std::int64_t columns = vector ? info.whole[0] : info.whole[1];
  const int size = info.slice.size;
  const int rank = info.slice.rank;
  if (info.split_dim == 1 || vector) {  // along the columns: every row, every chunk
    const std::int64_t chunk = columns / info.chunks;
    const std::int64_t width = chunk / size;
    for (std::int64_t row = 0; row < rows; ++row) {
      for (int k = 0; k < info.chunks; ++k) {
        run(row * columns + k * chunk + rank * width, (row * info.chunks + k) * width, width);
      }
    }
    return;
  }
  const std::int64_t chunk = rows / info.chunks;  // along the rows: a block of rows per chunk
  const std::int64_t height = chunk / size;
  for (int k = 0; k < info.chunks; ++k) {
    run((k * chunk + rank * height) * columns, k * height * columns, height * columns);
  }
}

}  // namespace

template <class T>
void copy_part(const ParameterInfo& info, std::span<const T> whole, std::span<T> part) {
  if (!info.split()) {
    std::copy_n(whole.begin(), info.numel(), part.begin());
    return;
  }
  for_each_run(info, [&](std::int64_t from, std::int64_t to, std::int64_t count) {
    std::copy_n(whole.begin() + from, count, part.begin() + to);
  });
}

template <class T>
void place_part(const ParameterInfo& info, std::span<const T> part, std::span<T> whole) {
  if (!info.split()) {
    std::copy_n(part.begin(), info.numel(), whole.begin());
    return;
  }
  for_each_run(info, [&](std::int64_t to, std::int64_t from, std::int64_t count) {
    std::copy_n(part.begin() + from, count, whole.begin() + to);
  });
}

template void copy_part<float>(const ParameterInfo&, std::span<const float>, std::span<float>);
template void copy_part<double>(const ParameterInfo&, std::span<const double>, std::span<double>);
template void place_part<float>(const ParameterInfo&, std::span<const float>, std::span<float>);
template void place_part<double>(const ParameterInfo&, std::span<const double>, std::span<double>);

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
  std::vector<T> whole;
  for (const ParameterInfo& info : layout.entries()) {
    whole.resize(static_cast<std::size_t>(info.whole.numel()));
    T* first = whole.data();
    T* last = first + whole.size();
    if (ends_with(info.name, ".bias")) {
      std::fill(first, last, T(0));
    } else if (info.shape.rank() == 1 && !ends_with(info.name, "class_embedding")) {  // a norm's gain
      std::fill(first, last, T(1));
    } else {
      const double std = ends_with(info.name, "c_proj.weight") ? residual_std : 0.02;
      Rng rng(derive_seed(seed, hash_name(info.name)));
      for (T* value = first; value != last; ++value) *value = static_cast<T>(std * rng.normal());
    }
    copy_part<T>(info, whole, values.subspan(static_cast<std::size_t>(info.offset)));
  }
}

template void init_parameters<float>(const ParameterLayout&, const ModelConfig&, std::uint64_t, std::span<float>);
template void init_parameters<double>(const ParameterLayout&, const ModelConfig&, std::uint64_t,
                                      std::span<double>);

}  // namespace pipeflow::nn
