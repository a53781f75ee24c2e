#include "pipeflow/nn/vision_language_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/tensor/embedding.h"
#include "pipeflow/tensor/gemm.h"

namespace pipeflow::nn {
namespace {

// The encoder's blocks as a GPT-2 stack of width D (their names and init).
ModelConfig vision_blocks(const VlmConfig& config) {
  return {.vocab_size = 1,
          .context = config.vision.positions(),
          .n_layer = config.vision.layers,
          .n_head = config.vision.heads,
          .n_embd = config.vision.width};
}

// The language model's layers of a VLM range, as a range of the text model.
std::optional<LayerRange> text_range(const VlmConfig& config, LayerRange range) {
  const int first = config.embedding_layer();
  if (range.last <= first) return std::nullopt;
  return LayerRange{std::max(range.first, first) - first, range.last - first};
}

}  // namespace

bool VisionConfig::operator==(const VisionConfig& other) const {
  return geometry.image_size == other.geometry.image_size && geometry.patch_size == other.geometry.patch_size &&
         geometry.channels == other.geometry.channels && width == other.width && heads == other.heads &&
         layers == other.layers;
}

void VlmConfig::validate() const {
  text.validate();
  if (text.llama()) fail("vlm text model: family llama: the vision-language model's language model is GPT-2's");
  const PatchGeometry& g = vision.geometry;
  auto require_positive = [](const char* field, int value) {
    if (value <= 0) fail("vlm vision {} = {}: must be positive", field, value);
  };
  require_positive("image_size", g.image_size);
  require_positive("patch_size", g.patch_size);
  require_positive("channels", g.channels);
  require_positive("width", vision.width);
  require_positive("heads", vision.heads);
  require_positive("layers", vision.layers);
  if (g.image_size % g.patch_size != 0) {
    fail("vlm vision image_size = {} is not a multiple of patch_size = {}: the image is cut into whole patches",
         g.image_size, g.patch_size);
  }
  if (vision.width % vision.heads != 0) {
    fail("vlm vision width = {} is not a multiple of heads = {}", vision.width, vision.heads);
  }
  if (vision.width > ModelConfig::kMaxWidth || vision.layers > ModelConfig::kMaxLayers ||
      g.image_size > ModelConfig::kMaxWidth) {
    fail("vlm vision width {}, layers {}, image_size {}: each must be at most {}, {}, {}", vision.width,
         vision.layers, g.image_size, ModelConfig::kMaxWidth, ModelConfig::kMaxLayers, ModelConfig::kMaxWidth);
  }
  if (text.context <= vision.tokens()) {
    fail("vlm text.context = {}: the language model's positions must exceed the {} image tokens ((image_size / "
         "patch_size)^2) to leave room for text; raise the context or the patch size",
         text.context, vision.tokens());
  }
}

std::string vlm_layer_name(const VlmConfig& config, int layer) {
  if (layer == 0) return "vision.patch_embedding";
  if (layer < config.projector_layer()) return fmt::format("vision.block.{}", layer - 1);
  if (layer == config.projector_layer()) return "projector";
  return pipeline_layer_name(config.text, layer - config.embedding_layer());
}

Shape vlm_activation_shape(const VlmConfig& config, int layer, int batch, int text_tokens) {
  if (layer <= config.projector_layer()) return {batch, config.vision.positions(), config.vision.width};
  if (layer == config.embedding_layer()) return {batch, config.vision.tokens(), config.text.n_embd};
  return {batch, config.vision.tokens() + text_tokens, config.text.n_embd};
}

ParameterLayout vlm_layout(const VlmConfig& config, LayerRange range) {
  config.validate();
  if (range.first < 0 || range.first >= range.last || range.last > config.pipeline_layers()) {
    fail("vlm layer range [{}, {}) is not a non-empty range inside [0, {})", range.first, range.last,
         config.pipeline_layers());
  }
  ParameterLayout layout(fmt::format("layers {}..{}", vlm_layer_name(config, range.first),
                                     vlm_layer_name(config, range.last - 1)));
  const std::int64_t d = config.vision.width, c = config.text.n_embd;
  if (range.first == 0) {
    layout.add("vision.embeddings.patch_embedding.weight", {config.vision.geometry.patch_features(), d}, true);
    layout.add("vision.embeddings.class_embedding", {d}, false);
    layout.add("vision.embeddings.position_embedding.weight", {config.vision.positions(), d}, true);
    layout.add("vision.pre_layrnorm.weight", {d}, false);
    layout.add("vision.pre_layrnorm.bias", {d}, false);
  }
  const int first_vit = std::max(range.first, 1), last_vit = std::min(range.last, config.projector_layer());
  if (first_vit < last_vit) layout.append(ParameterLayout(vision_blocks(config), {first_vit, last_vit}), "vision.");
  if (range.first <= config.projector_layer() && config.projector_layer() < range.last) {
    layout.add("projector.fc1.weight", {d, c}, true);
    layout.add("projector.fc1.bias", {c}, false);
    layout.add("projector.fc2.weight", {c, c}, true);
    layout.add("projector.fc2.bias", {c}, false);
  }
  if (const auto text = text_range(config, range)) layout.append(ParameterLayout(config.text, *text), "");
  return layout;
}

namespace {

// The language model's block index of each block layer in `range`.
std::vector<int> vlm_block_numbers(const VlmConfig& config, LayerRange range) {
  std::vector<int> numbers;
  const int first_block = config.embedding_layer() + 1;
  for (int layer = std::max(range.first, first_block); layer < std::min(range.last, config.head_layer()); ++layer) {
    numbers.push_back(layer - first_block);
  }
  return numbers;
}

}  // namespace

VlmStageLayouts vlm_stage_layouts(const VlmConfig& config, LayerRange range, const VlmStageOptions& options) {
  VlmStageLayouts layouts{.trained = ParameterLayout(options.name),
                          .frozen = ParameterLayout(options.name + " (frozen)")};
  const ParameterLayout whole = vlm_layout(config, range);
  for (const ParameterInfo& info : whole.entries()) {
    const bool vision = info.name.starts_with("vision."), projector = info.name.starts_with("projector.");
    const bool frozen = vision ? options.freeze_vision : !projector && options.lora.has_value();
    (frozen ? layouts.frozen : layouts.trained).add(info.name, info.shape, info.decay);
  }
  if (options.lora) {
    const int c = config.text.n_embd;
    for (const int i : vlm_block_numbers(config, range)) {
      layouts.trained.add(fmt::format("h.{}.attn.c_attn.lora_A", i), {c, options.lora->r}, false);
      layouts.trained.add(fmt::format("h.{}.attn.c_attn.lora_B", i), {options.lora->r, 3 * c}, false);
    }
  }
  return layouts;
}

template <class T>
BasicVlmStage<T>::BasicVlmStage(const VlmConfig& config, LayerRange layers, VlmStageOptions options)
    : config_(config),
      range_(layers),
      options_(std::move(options)),
      layout_(options_.name),
      frozen_layout_(options_.name + " (frozen)"),
      weight_memory_(options_.name + " weights"),
      activation_memory_(options_.name + " activations") {
  if (options_.lora && (options_.lora->r < 1 || !(options_.lora->alpha > 0))) {
    fail("{}: lora r = {}, alpha = {}: r must be a positive rank and alpha positive (e.g. r 8, alpha 16)", where(),
         options_.lora->r, options_.lora->alpha);
  }
  const int c = config_.text.n_embd;
  block_numbers_ = vlm_block_numbers(config_, range_);
  VlmStageLayouts layouts = vlm_stage_layouts(config_, range_, options_);
  layout_ = std::move(layouts.trained);
  frozen_layout_ = std::move(layouts.frozen);
  if (options_.lora) {
    merged_ = BasicTensor<T>({static_cast<std::int64_t>(block_numbers_.size()) * c * 3 * c}, {nullptr, &weight_memory_});
  }
  values_ = BasicTensor<T>({layout_.total()}, {nullptr, &weight_memory_});
  grads_ = BasicTensor<T>({layout_.total()}, {nullptr, &weight_memory_});
  if (frozen_layout_.total() > 0) frozen_values_ = BasicTensor<T>({frozen_layout_.total()}, {nullptr, &weight_memory_});
  if (options_.lora && frozen_layout_.total() > 0) {
    frozen_grads_ = BasicTensor<T>({frozen_layout_.total()}, {nullptr, &weight_memory_});
  }
  // A tensor's value, and its gradient (null when frozen).
  auto value = [&](const std::string& name) -> const T* {
    if (const ParameterInfo* info = layout_.find(name)) return values_.data() + info->offset;
    return frozen_values_.data() + frozen_layout_.at(name).offset;
  };
  auto grad = [&](const std::string& name) -> T* {
    const ParameterInfo* info = layout_.find(name);
    return info == nullptr ? nullptr : grads_.data() + info->offset;
  };
  // A frozen encoder's block has no gradients; a LoRA block's go to
  // frozen_grads_ and it multiplies by its merged c_attn.
  auto block = [&](const std::string& prefix, bool causal) {
    const bool frozen = frozen_layout_.find(prefix + "ln_1.weight") != nullptr;
    const ParameterLayout& holder = frozen ? frozen_layout_ : layout_;
    const T* base = frozen ? frozen_values_.data() : values_.data();
    auto weights = gpt2_block_params<const T*>(holder, prefix, base);
    BlockParams<T*> grads;
    if (!frozen) {
      grads = gpt2_block_params<T*>(layout_, prefix, grads_.data());
    } else if (causal) {  // the language model's, under LoRA
      grads = gpt2_block_params<T*>(frozen_layout_, prefix, frozen_grads_.data());
      weights.attn_weight = merged_.data() + static_cast<long>(blocks_.size()) * c * 3 * c;
    }
    return TransformerBlock<T>(weights, grads, std::nullopt, nullptr, false, causal);
  };
  if (has_images()) {
    const auto params = [](auto tensor) {
      return PatchEmbeddingParams<decltype(tensor(""))>{
          tensor("vision.embeddings.patch_embedding.weight"), tensor("vision.embeddings.class_embedding"),
          tensor("vision.embeddings.position_embedding.weight"), tensor("vision.pre_layrnorm.weight"),
          tensor("vision.pre_layrnorm.bias")};
    };
    patch_.emplace(config_.vision.geometry, params(value), params(grad));
  }
  for (int layer = std::max(range_.first, 1); layer < std::min(range_.last, config_.projector_layer()); ++layer) {
    vit_.push_back(block(fmt::format("vision.h.{}.", layer - 1), false));
  }
  if (has_layer(config_.projector_layer())) {
    projector_.emplace(config_.vision.width, config_.text.n_embd,
                       ProjectorParams<const T*>{value("projector.fc1.weight"), value("projector.fc1.bias"),
                                                 value("projector.fc2.weight"), value("projector.fc2.bias")},
                       ProjectorParams<T*>{grad("projector.fc1.weight"), grad("projector.fc1.bias"),
                                           grad("projector.fc2.weight"), grad("projector.fc2.bias")});
  }
  if (has_text_embedding()) {
    wte_ = value("wte.weight");
    wpe_ = value("wpe.weight");
    d_wte_ = grad("wte.weight");
    d_wpe_ = grad("wpe.weight");
  }
  for (const int i : block_numbers_) blocks_.push_back(block(fmt::format("h.{}.", i), true));
  if (has_head()) {
    head_.emplace(HeadParams<const T*>{value("ln_f.weight"), value("ln_f.bias"), value("wte.weight")},
                  HeadParams<T*>{grad("ln_f.weight"), grad("ln_f.bias"), grad("wte.weight")});
  }
}

template <class T>
std::string BasicVlmStage<T>::where() const {
  return fmt::format("{} ({}..{})", options_.name, vlm_layer_name(config_, range_.first),
                     vlm_layer_name(config_, range_.last - 1));
}

template <class T>
typename BasicVlmStage<T>::Kind BasicVlmStage<T>::kind(int layer) const {
  if (layer == 0) return Kind::kPatch;
  if (layer < config_.projector_layer()) return Kind::kVit;
  if (layer == config_.projector_layer()) return Kind::kProjector;
  if (layer == config_.embedding_layer()) return Kind::kEmbedding;
  if (layer == config_.head_layer()) return Kind::kHead;
  return Kind::kBlock;
}

// --- Parameters ---

template <class T>
std::span<T> BasicVlmStage<T>::parameter(std::string_view name) {
  const auto found = static_cast<const BasicVlmStage*>(this)->parameter(name);
  return {const_cast<T*>(found.data()), found.size()};
}

template <class T>
std::span<const T> BasicVlmStage<T>::parameter(std::string_view name) const {
  const bool trained = layout_.find(name) != nullptr;
  const ParameterInfo& info = trained ? layout_.at(name) : frozen_layout_.at(name);
  const T* base = trained ? values_.data() : frozen_values_.data();
  return {base + info.offset, static_cast<std::size_t>(info.numel())};
}

template <class T>
std::span<T> BasicVlmStage<T>::gradient(std::string_view name) {
  const ParameterInfo& info = layout_.at(name);
  return grads_.span().subspan(static_cast<std::size_t>(info.offset), static_cast<std::size_t>(info.numel()));
}

template <class T>
std::span<const T> BasicVlmStage<T>::gradient(std::string_view name) const {
  const ParameterInfo& info = layout_.at(name);
  return grads_.span().subspan(static_cast<std::size_t>(info.offset), static_cast<std::size_t>(info.numel()));
}

template <class T>
void BasicVlmStage<T>::init_parameters(std::uint64_t seed) {
  nn::init_parameters(layout_, config_.text, seed, values_.span());
  nn::init_parameters(frozen_layout_, config_.text, seed, frozen_values_.span());
  for (const int i : block_numbers_) {
    if (const ParameterInfo* b = layout_.find(fmt::format("h.{}.attn.c_attn.lora_B", i))) {
      std::fill_n(values_.data() + b->offset, b->numel(), T(0));
    }
  }
}

template <class T>
void BasicVlmStage<T>::merge_adapters() {
  if (!options_.lora) return;
  const int c = config_.text.n_embd, r = options_.lora->r;
  for (std::size_t k = 0; k < block_numbers_.size(); ++k) {
    const std::string prefix = fmt::format("h.{}.attn.c_attn.", block_numbers_[k]);
    T* merged = merged_.data() + static_cast<long>(k) * c * 3 * c;
    const auto base = parameter(prefix + "weight");
    std::copy(base.begin(), base.end(), merged);
    gemm<T>(Transpose::kNo, Transpose::kNo, c, 3 * c, r, static_cast<T>(options_.lora->scale()),
            parameter(prefix + "lora_A").data(), r, parameter(prefix + "lora_B").data(), 3 * c, T(1), merged, 3 * c);
  }
}

template <class T>
void BasicVlmStage<T>::adapter_gradients(int block) {
  const int c = config_.text.n_embd, r = options_.lora->r;
  const std::string prefix = fmt::format("h.{}.attn.c_attn.", block_numbers_[static_cast<std::size_t>(block)]);
  T* dw = frozen_grads_.data() + frozen_layout_.at(prefix + "weight").offset;
  const T s = static_cast<T>(options_.lora->scale());
  gemm<T>(Transpose::kNo, Transpose::kYes, c, r, 3 * c, s, dw, 3 * c, parameter(prefix + "lora_B").data(), 3 * c,
          T(1), gradient(prefix + "lora_A").data(), r);
  gemm<T>(Transpose::kYes, Transpose::kNo, r, 3 * c, c, s, parameter(prefix + "lora_A").data(), r, dw, 3 * c, T(1),
          gradient(prefix + "lora_B").data(), 3 * c);
  std::fill_n(dw, 3 * c * c, T(0));
}

template <class T>
void BasicVlmStage<T>::copy_parameters_from(const BasicVlmStage& source) {
  if (!(source.config_ == config_)) fail("{}: cannot copy parameters from a model of another shape", where());
  for (const ParameterLayout* layout : {&layout_, &frozen_layout_}) {
    for (const ParameterInfo& info : layout->entries()) {
      if (info.name.find(".lora_") != std::string::npos && source.layout_.find(info.name) == nullptr) continue;
      const auto from = source.parameter(info.name);
      std::copy(from.begin(), from.end(), parameter(info.name).begin());
    }
  }
}

// --- Checks ---

template <class T>
void BasicVlmStage<T>::check_input(State& state, const Input& input) const {
  const VlmConfig& c = config_;
  const int n = c.vision.tokens();
  const bool takes_text = has_text_embedding();
  auto check_tokens = [&](const IntTensor& tokens, const char* what, int b) {
    if (tokens.shape().rank() != 2 || tokens.dim(0) != b || tokens.dim(1) < 1) {
      fail("{}: needs {} as an int32 tensor [{}, T_c], got {}", where(), what, b, tokens.shape().to_string());
    }
    for (std::int64_t i = 0; i < tokens.numel(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= c.text.vocab_size) {
        fail("{}: {} [{}, {}] = {} is outside the vocabulary [0, {})", where(), what, i / tokens.dim(1),
             i % tokens.dim(1), tokens[i], c.text.vocab_size);
      }
    }
    return static_cast<int>(tokens.dim(1));
  };
  int b = 0;
  int text_tokens = 0;  // T_c, 0 until known
  if (has_images()) {
    const PatchGeometry& g = c.vision.geometry;
    const Shape& s = input.images.shape();
    if (s.rank() != 4 || s[1] != g.channels || s[2] != g.image_size || s[3] != g.image_size) {
      fail("{}: needs images [B, {}, {}, {}], got {}", where(), g.channels, g.image_size, g.image_size,
           s.to_string());
    }
    if (!input.activation.empty()) fail("{}: holds the patch embedding and takes images, not an activation", where());
    b = static_cast<int>(s[0]);
  } else {
    if (!input.images.empty()) fail("{}: takes the previous stage's activation, not images", where());
    const Shape& s = input.activation.shape();
    const int layer = range_.first;
    const bool text_follows = layer > c.embedding_layer();  // the activation holds the text positions
    if (s.rank() == 3) {
      b = static_cast<int>(s[0]);
      if (text_follows) text_tokens = static_cast<int>(s[1]) - n;
    }
    if (s.rank() != 3 || (text_follows && text_tokens < 1) || s != vlm_activation_shape(c, layer, b, text_tokens)) {
      const Shape expected = vlm_activation_shape(c, layer, 1, 0);
      fail("{}: needs an activation [B, {}, {}] from the previous stage, got {}", where(),
           text_follows ? fmt::format("{} + T_c", n) : fmt::format("{}", expected[1]), expected[2], s.to_string());
    }
  }
  if (takes_text) {
    text_tokens = check_tokens(input.tokens, "tokens", b);
  } else if (!input.tokens.empty()) {
    fail("{}: does not hold the language model's embedding and takes no tokens", where());
  }
  if (has_head()) {
    const int targets = check_tokens(input.targets, "targets", b);
    if (targets != text_tokens) {
      fail("{}: targets have {} positions, the text has {}: one target per text token", where(), targets,
           text_tokens);
    }
  } else if (!input.targets.empty()) {
    fail("{}: does not hold the head and takes no targets", where());
  }
  if (n + text_tokens > c.text.context) {
    fail("{}: {} image tokens + {} text tokens exceed the language model's context of {}", where(), n, text_tokens,
         c.text.context);
  }
  state.vision_ = {b, c.vision.positions(), c.vision.width, c.vision.heads, 0};
  state.text_ = {b, n + text_tokens, c.text.n_embd, c.text.n_head, c.text.vocab_size};
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::take_positions(const BasicTensor<T>& x, int first, int count) {
  const std::int64_t b = x.dim(0), t = x.dim(1), width = x.dim(2);
  auto taken = BasicTensor<T>::uninitialized({b, count, width}, allocator());
  for (std::int64_t i = 0; i < b; ++i) {
    std::copy_n(x.data() + (i * t + first) * width, count * width, taken.data() + i * count * width);
  }
  return taken;
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::place_positions(const BasicTensor<T>& x, int first, int positions) {
  const std::int64_t b = x.dim(0), count = x.dim(1), width = x.dim(2);
  BasicTensor<T> placed({b, positions, width}, allocator());
  for (std::int64_t i = 0; i < b; ++i) {
    std::copy_n(x.data() + i * count * width, count * width, placed.data() + (i * positions + first) * width);
  }
  return placed;
}

// --- The LM's embedding with the image tokens in front ---

template <class T>
BasicTensor<T> BasicVlmStage<T>::join_forward(State& state, BasicTensor<T> image, IntTensor tokens) {
  const LayerShape& s = state.text_;
  const int n = config_.vision.tokens(), text = s.t - n;
  auto x = BasicTensor<T>::uninitialized({s.b, s.t, s.c}, allocator());
  for (int b = 0; b < s.b; ++b) {
    T* row = x.data() + static_cast<long>(b) * s.t * s.c;
    const T* from = image.data() + static_cast<long>(b) * n * s.c;
    for (long i = 0; i < static_cast<long>(n) * s.c; ++i) row[i] = from[i] + wpe_[i];
    embedding_forward(row + static_cast<long>(n) * s.c, tokens.data() + static_cast<long>(b) * text, wte_,
                      wpe_ + static_cast<long>(n) * s.c, 1, text, s.c);
  }
  state.join_.tokens = std::move(tokens);
  return x;
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::join_backward_input(State& state, BasicTensor<T> dx) {
  const LayerShape& s = state.text_;
  const int n = config_.vision.tokens();
  auto d_image = BasicTensor<T>::uninitialized({s.b, n, s.c}, allocator());
  for (int b = 0; b < s.b; ++b) {
    std::copy_n(dx.data() + static_cast<long>(b) * s.t * s.c, static_cast<long>(n) * s.c,
                d_image.data() + static_cast<long>(b) * n * s.c);
  }
  state.join_.dx = std::move(dx);
  return d_image;
}

template <class T>
void BasicVlmStage<T>::join_backward_weight(State& state) {
  const LayerShape& s = state.text_;
  const int n = config_.vision.tokens(), text = s.t - n;
  for (int b = 0; b < s.b; ++b) {
    const T* d = state.join_.dx.data() + static_cast<long>(b) * s.t * s.c;
    for (long i = 0; i < static_cast<long>(n) * s.c; ++i) d_wpe_[i] += d[i];
    embedding_backward_weight(d_wte_, d_wpe_ + static_cast<long>(n) * s.c, d + static_cast<long>(n) * s.c,
                              state.join_.tokens.data() + static_cast<long>(b) * text, 1, text, s.c);
  }
  state.join_ = {};
}

// --- Layers ---

template <class T>
BasicTensor<T> BasicVlmStage<T>::forward_layer(State& state, int layer, BasicTensor<T> x, IntTensor& tokens) {
  switch (kind(layer)) {
    case Kind::kPatch:
      return patch_->forward(state.patch_, x, state.vision_, allocator());
    case Kind::kVit: {
      const auto i = static_cast<std::size_t>(layer - std::max(range_.first, 1));
      return vit_[i].forward(state.vit_[i], std::move(x), state.vision_, allocator());
    }
    case Kind::kProjector:  // the patch tokens, the class token (position 0) dropped
      return projector_->forward(state.projector_, take_positions(x, 1, config_.vision.tokens()), allocator());
    case Kind::kEmbedding:
      return join_forward(state, std::move(x), std::move(tokens));
    case Kind::kBlock: {
      const auto i = static_cast<std::size_t>(layer - std::max(range_.first, config_.embedding_layer() + 1));
      return blocks_[i].forward(state.blocks_[i], std::move(x), state.text_, allocator());
    }
    case Kind::kHead: {
      // The loss reads the text positions only: the last T_c of each sequence.
      const LayerShape& s = state.text_;
      const int n = config_.vision.tokens(), text = s.t - n;
      state.loss_ = head_->forward(state.head_, take_positions(x, n, text), state.targets_,
                                   {s.b, text, s.c, s.nh, s.v}, allocator());
      return {};
    }
  }
  return {};
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::input_layer(State& state, int layer, BasicTensor<T> grad, double loss_scale) {
  switch (kind(layer)) {
    case Kind::kPatch:
      patch_->backward_input(state.patch_, std::move(grad), state.vision_, allocator());
      return {};
    case Kind::kVit: {
      const auto i = static_cast<std::size_t>(layer - std::max(range_.first, 1));
      return vit_[i].backward_input(state.vit_[i], std::move(grad), state.vision_, allocator());
    }
    case Kind::kProjector:  // the class token's gradient is zero
      return place_positions(projector_->backward_input(state.projector_, std::move(grad), allocator()), 1,
                             config_.vision.positions());
    case Kind::kEmbedding:
      return join_backward_input(state, std::move(grad));
    case Kind::kBlock: {
      const auto i = static_cast<std::size_t>(layer - std::max(range_.first, config_.embedding_layer() + 1));
      return blocks_[i].backward_input(state.blocks_[i], std::move(grad), state.text_, allocator());
    }
    case Kind::kHead: {
      const LayerShape& s = state.text_;
      const int n = config_.vision.tokens(), text = s.t - n;
      // The image positions have no loss: their gradient is zero.
      return place_positions(
          head_->backward_input(state.head_, state.targets_, loss_scale, {s.b, text, s.c, s.nh, s.v}, allocator()),
          n, s.t);
    }
  }
  return {};
}

template <class T>
void BasicVlmStage<T>::weight_layer(State& state, int layer) {
  if (skips_weight_pass(layer)) return;
  switch (kind(layer)) {
    case Kind::kPatch:
      patch_->backward_weight(state.patch_, state.vision_);
      break;
    case Kind::kVit: {
      const auto i = static_cast<std::size_t>(layer - std::max(range_.first, 1));
      vit_[i].backward_weight(state.vit_[i], state.vision_);
      break;
    }
    case Kind::kProjector:
      projector_->backward_weight(state.projector_);
      break;
    case Kind::kEmbedding:
      join_backward_weight(state);
      break;
    case Kind::kBlock: {
      const auto i = static_cast<std::size_t>(layer - std::max(range_.first, config_.embedding_layer() + 1));
      blocks_[i].backward_weight(state.blocks_[i], state.text_);
      if (options_.lora) adapter_gradients(static_cast<int>(i));
      break;
    }
    case Kind::kHead: {
      const LayerShape& s = state.text_;
      head_->backward_weight(state.head_, {s.b, s.t - config_.vision.tokens(), s.c, s.nh, s.v});
      break;
    }
  }
}

// --- Passes ---

template <class T>
BasicTensor<T> BasicVlmStage<T>::forward(State& state, Input input) {
  if (state.phase_ != State::Phase::kEmpty) fail("{}: forward needs a fresh (or fully backpropagated) state", where());
  check_input(state, input);
  merge_adapters();
  input.images.charge_to(&activation_memory_);
  input.activation.charge_to(&activation_memory_);
  input.tokens.charge_to(&activation_memory_);
  input.targets.charge_to(&activation_memory_);
  state.targets_ = std::move(input.targets);
  state.vit_.resize(vit_.size());
  state.blocks_.resize(blocks_.size());
  BasicTensor<T> x = has_images() ? std::move(input.images) : std::move(input.activation);
  for (int layer = range_.first; layer < range_.last; ++layer) {
    x = forward_layer(state, layer, std::move(x), input.tokens);
  }
  if (options_.freeze_vision) {  // a frozen encoder's backward stops at the projector: keep nothing of it
    state.patch_ = {};
    for (auto& saved : state.vit_) saved = {};
  }
  state.phase_ = State::Phase::kForward;
  return x;
}

// From the last layer down to the first trained one: a frozen encoder's
// layers run neither I nor W (nothing below them trains).
template <class T>
BasicTensor<T> BasicVlmStage<T>::input_pass(State& state, BasicTensor<T> grad, double loss_scale,
                                            bool weight_pass_follows) {
  for (int layer = range_.last - 1; layer >= range_.first && !frozen(layer); --layer) {
    grad = input_layer(state, layer, std::move(grad), loss_scale);
    if (weight_pass_follows) weight_layer(state, layer);
  }
  if (options_.freeze_vision && range_.first <= config_.projector_layer()) grad = {};  // the encoder takes none
  if (weight_pass_follows) {
    end_microbatch(state);
  } else {
    state.targets_.reset();
    state.phase_ = State::Phase::kInputGrad;
  }
  return grad;
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::input_pass_from_output(State& state, BasicTensor<T> grad_output,
                                                        bool weight_pass_follows, const char* pass) {
  if (state.phase_ != State::Phase::kForward) fail("{}: {} needs a completed forward", where(), pass);
  if (has_head()) fail("{}: holds the head: its backward starts at the loss ({}_from_loss)", where(), pass);
  grad_output.charge_to(&activation_memory_);
  return input_pass(state, std::move(grad_output), 1.0, weight_pass_follows);
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::input_pass_from_loss(State& state, double loss_scale, bool weight_pass_follows,
                                                      const char* pass) {
  if (state.phase_ != State::Phase::kForward) fail("{}: {} needs a completed forward", where(), pass);
  if (!has_head()) fail("{}: does not hold the head: its backward takes the next stage's gradient", where());
  return input_pass(state, {}, loss_scale, weight_pass_follows);
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::backward_input(State& state, BasicTensor<T> grad_output) {
  return input_pass_from_output(state, std::move(grad_output), false, "backward_input");
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::backward_input_from_loss(State& state, double loss_scale) {
  return input_pass_from_loss(state, loss_scale, false, "backward_input_from_loss");
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::backward(State& state, BasicTensor<T> grad_output) {
  return input_pass_from_output(state, std::move(grad_output), true, "backward");
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::backward_from_loss(State& state, double loss_scale) {
  return input_pass_from_loss(state, loss_scale, true, "backward_from_loss");
}

template <class T>
void BasicVlmStage<T>::backward_weight(State& state) {
  if (state.phase_ != State::Phase::kInputGrad) fail("{}: backward_weight needs a completed backward_input", where());
  for (int layer = range_.last - 1; layer >= range_.first && !frozen(layer); --layer) weight_layer(state, layer);
  end_microbatch(state);
}

template <class T>
void BasicVlmStage<T>::end_microbatch(State& state) {
  const double loss = state.loss_;
  state = State();
  state.loss_ = loss;
}

template <class T>
BasicTensor<T> BasicVlmStage<T>::logits(BasicTensor<T> images, IntTensor tokens) {
  if (!has_images() || !has_head()) fail("{}: logits need a stage holding the whole model", where());
  State state;
  Input input;
  input.images = std::move(images);
  input.tokens = std::move(tokens);
  // The checks take targets of the text's shape; inference has none.
  input.targets = IntTensor({input.tokens.dim(0), input.tokens.dim(1)});
  check_input(state, input);
  merge_adapters();
  state.vit_.resize(vit_.size());
  state.blocks_.resize(blocks_.size());
  BasicTensor<T> x = std::move(input.images);
  for (int layer = range_.first; layer < config_.head_layer(); ++layer) {
    x = forward_layer(state, layer, std::move(x), input.tokens);
  }
  const LayerShape& s = state.text_;
  const int n = config_.vision.tokens(), text = s.t - n;
  return head_->logits(take_positions(x, n, text), {s.b, text, s.c, s.nh, s.v}, allocator());
}

std::vector<std::string> greedy_captions(BasicVlmStage<float>& model, const Tensor& images, std::int32_t start,
                                         int bytes) {
  const int b = static_cast<int>(images.dim(0));
  const int v = model.config().text.vocab_size;
  std::vector<std::vector<std::int32_t>> text(static_cast<std::size_t>(b), std::vector<std::int32_t>{start});
  for (int step = 0; step < bytes; ++step) {
    const int t = step + 1;
    IntTensor tokens({b, t});
    for (int i = 0; i < b; ++i) std::copy_n(text[static_cast<std::size_t>(i)].begin(), t, tokens.data() + i * t);
    const Tensor logits = model.logits(images.clone(), std::move(tokens));
    for (int i = 0; i < b; ++i) {
      const float* row = logits.data() + (static_cast<long>(i) * t + t - 1) * v;
      text[static_cast<std::size_t>(i)].push_back(static_cast<std::int32_t>(std::max_element(row, row + v) - row));
    }
  }
  std::vector<std::string> captions;
  for (const auto& tokens : text) {
    std::string caption;
    for (std::size_t j = 1; j < tokens.size(); ++j) caption += static_cast<char>(tokens[j]);
    captions.push_back(std::move(caption));
  }
  return captions;
}

CaptionScore score_captions(BasicVlmStage<float>& model, const ShapeCaptions& data, int images) {
  const ShapeCaptions::Batch batch = data.batch(Split::kValidation, 0, 0, images);
  const std::vector<std::string> captions =
      greedy_captions(model, batch.images, ShapeCaptions::kStartToken, ShapeCaptions::kCaptionBytes);
  CaptionScore score{.right = 0, .images = images, .expected = "", .generated = captions.front()};
  for (int i = 0; i < images; ++i) {
    const std::string expected = ShapeCaptions::caption(data.sample(Split::kValidation, 0, i));
    score.right += captions[static_cast<std::size_t>(i)] == expected;
    if (i == 0) score.expected = expected;
  }
  return score;
}

double held_out_loss(BasicVlmStage<float>& model, const ShapeCaptions& data, int microbatches, int batch) {
  if (microbatches < 1 || batch < 1) {
    fail("internal: a held-out loss of {} micro-batches of {} samples: both must be >= 1", microbatches, batch);
  }
  double total = 0;  // every micro-batch holds `batch` samples: the mean of their means is the mean
  for (int j = 0; j < microbatches; ++j) {
    ShapeCaptions::Batch samples =
        data.batch(Split::kValidation, 0, static_cast<std::int64_t>(j) * batch, batch, model.allocator());
    BasicVlmState<float> state;
    model.forward(state, {.images = std::move(samples.images),
                          .activation = {},
                          .tokens = std::move(samples.tokens),
                          .targets = std::move(samples.targets)});
    total += state.loss();
  }
  return total / microbatches;
}

// --- Gradients ---

template <class T>
void BasicVlmStage<T>::zero_gradients() {
  // A stage of frozen layers alone trains nothing: its gradient buffer is empty (null).
  if (!grads_.empty()) std::memset(grads_.data(), 0, static_cast<std::size_t>(grads_.bytes()));
}

template <class T>
double BasicVlmStage<T>::gradient_square_sum(std::int64_t begin, std::int64_t end) const {
  double total = 0;
  for (const ParameterInfo& info : layout_.entries()) {
    if (info.name == "wte.weight" && !has_text_embedding()) continue;  // the embedding's stage counts it
    const std::int64_t from = std::max(begin, info.offset);
    const T* g = grads_.data() + from;
    for (std::int64_t i = 0; i < std::min(end, info.offset + info.numel()) - from; ++i) {
      total += static_cast<double>(g[i]) * g[i];
    }
  }
  return total;
}

template <class T>
void BasicVlmStage<T>::scale_gradients(double factor) {
  const T f = static_cast<T>(factor);
  for (T& g : grads_.span()) g *= f;
}

template <class T>
void BasicVlmStage<T>::add_tied_gradient(std::span<const T> other) {
  auto mine = tied_gradient();
  if (other.size() != mine.size()) {
    fail("{}: the tied embedding's gradient (wte.weight) has {} elements, expected {}", where(), other.size(),
         mine.size());
  }
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] += other[i];
}

template class BasicVlmStage<float>;
template class BasicVlmStage<double>;

}  // namespace pipeflow::nn
