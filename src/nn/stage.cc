#include "pipeflow/nn/stage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "pipeflow/core/error.h"
#include "pipeflow/core/units.h"
#include "pipeflow/tensor/embedding.h"
#include "pipeflow/tensor/rope.h"

namespace pipeflow::nn {
namespace {

template <class P, class Buffer>
BlockParams<P> block_params(const ModelConfig& config, const ParameterLayout& layout, int block, Buffer* base) {
  if (config.llama()) {
    const std::string p = fmt::format("model.layers.{}.", block);
    auto at = [&](const char* name) { return base + layout.at(p + name).offset; };
    return {.ln_1_weight = at("input_layernorm.weight"),
            .ln_2_weight = at("post_attention_layernorm.weight"),
            .q_proj = at("self_attn.q_proj.weight"),
            .k_proj = at("self_attn.k_proj.weight"),
            .v_proj = at("self_attn.v_proj.weight"),
            .o_proj = at("self_attn.o_proj.weight"),
            .gate_proj = at("mlp.gate_proj.weight"),
            .up_proj = at("mlp.up_proj.weight"),
            .down_proj = at("mlp.down_proj.weight")};
  }
  return gpt2_block_params<P>(layout, fmt::format("h.{}.", block), base);
}

template <class P, class Buffer>
EmbeddingParams<P> embedding_params(const ModelConfig& config, const ParameterLayout& layout, Buffer* base) {
  return {base + layout.at(config.embedding_name()).offset,
          config.llama() ? nullptr : base + layout.at("wpe.weight").offset};
}

template <class P, class Buffer>
HeadParams<P> head_params(const ModelConfig& config, const ParameterLayout& layout, Buffer* base) {
  const bool llama = config.llama();
  auto at = [&](const char* name) { return base + layout.at(name).offset; };
  return {at(llama ? "model.norm.weight" : "ln_f.weight"), llama ? nullptr : at("ln_f.bias"),
          at(config.head_matrix_name())};
}

std::string shape_text(const Shape& shape) { return shape.to_string(); }

template <class Span>
Span slice(Span buffer, const ParameterInfo& info) {
  return buffer.subspan(static_cast<std::size_t>(info.offset), static_cast<std::size_t>(info.numel()));
}

}  // namespace

template <class T>
BasicStage<T>::BasicStage(const ModelConfig& config, LayerRange layers, StageOptions options)
    : config_(config),
      range_(layers),
      options_(std::move(options)),
      layout_(config, layers,
              options_.tensor == nullptr ? TensorSlice{} : TensorSlice{options_.tensor->size(), options_.tensor->rank()}),
      weight_memory_(options_.name + " weights"),
      activation_memory_(options_.name + " activations"),
      values_({layout_.total()}, {nullptr, &weight_memory_}),
      grads_({layout_.total()}, {nullptr, &weight_memory_}) {
  if (options_.recompute_interval < 0) {
    fail("{}: activation_checkpoint_interval = {}: must be 0 (off) or a number of layers", where(),
         options_.recompute_interval);
  }
  if constexpr (!std::is_same_v<T, float>) {
    if (split()) fail("{}: only float stages split over a tensor-parallel group", where());
  }
  if (half()) {
    if constexpr (!std::is_same_v<T, float>) {
      fail("{}: computes in {}: only float stages round to half precision", where(), to_string(options_.format));
    }
    half_values_ = BasicTensor<std::uint16_t>({layout_.total()}, {nullptr, &weight_memory_});
    if (options_.format == ComputeFormat::kBf16) gemm_precision_ = resolve(options_.bf16_gemm);
  }
  // The layers start pointed at the master weights; a half stage points
  // each at its window before each pass (layer_weights).
  const T* v = values_.data();
  T* g = grads_.data();
  const bool llama = config_.llama();
  if (has_embedding()) {
    embedding_.emplace(embedding_params<const T*>(config_, layout_, v), embedding_params<T*>(config_, layout_, g),
                       options_.tensor, options_.sequence_parallel);
  }
  std::optional<LlamaConstants<T>> constants;
  if (llama) {
    const int half = config_.head_size() / 2;
    rope_cos_ = BasicTensor<T>({config_.context, half}, {nullptr, &weight_memory_});
    rope_sin_ = BasicTensor<T>({config_.context, half}, {nullptr, &weight_memory_});
    const std::vector<double> frequencies = rope_frequencies(config_);
    rope_table(rope_cos_.data(), rope_sin_.data(), frequencies.data(), config_.context, half);
    constants = LlamaConstants<T>{.kv_heads = config_.kv_heads(),
                                  .ffn = config_.ffn(),
                                  .norm_eps = config_.norm_eps,
                                  .rope_cos = rope_cos_.data(),
                                  .rope_sin = rope_sin_.data()};
  }
  for (int layer = std::max(range_.first, 1); layer < std::min(range_.last, config_.n_layer + 1); ++layer) {
    blocks_.emplace_back(block_params<const T*>(config_, layout_, layer - 1, v),
                         block_params<T*>(config_, layout_, layer - 1, g), constants, options_.tensor,
                         options_.sequence_parallel);
  }
  if (has_head()) {
    head_.emplace(head_params<const T*>(config_, layout_, v), head_params<T*>(config_, layout_, g),
                  llama ? std::optional<double>(config_.norm_eps) : std::nullopt, options_.tensor,
                  options_.sequence_parallel);
  }
  if (half()) {
    const TensorSlice slice = split() ? TensorSlice{options_.tensor->size(), options_.tensor->rank()} : TensorSlice{};
    for (int layer = range_.first; layer < range_.last; ++layer) {
      LayerWindow window{ParameterLayout(config_, {layer, layer + 1}, slice), {}};
      const bool embedding = layer == 0;
      for (const ParameterInfo& info : window.layout.entries()) {
        window.tensors.push_back(
            {layout_.at(info.name).offset, info.offset, info.numel(), !embedding && info.shape.rank() == 2});
      }
      windows_.push_back(std::move(window));
    }
  }
}

template <class T>
std::string BasicStage<T>::where() const {
  return fmt::format("{} ({}..{})", options_.name, pipeline_layer_name(config_, range_.first),
                     pipeline_layer_name(config_, range_.last - 1));
}

// --- Parameters ---

template <class T>
std::span<T> BasicStage<T>::parameter(std::string_view name) {
  require_matrices("parameter");
  compute_stale_ = true;
  return slice(values_.span(), layout_.at(name));
}

template <class T>
void BasicStage<T>::refresh_half_weights() {
  if (!half() || !compute_stale_) return;
  if constexpr (std::is_same_v<T, float>) {
    to_half_bits(options_.format, values_.data(), half_values_.data(), values_.numel());
  }
  compute_stale_ = false;
}

template <class T>
void BasicStage<T>::point_layer(int local, const ParameterLayout& layout, const T* base) {
  switch (kind(local)) {
    case Kind::kEmbedding: embedding_->read_weights_from(embedding_params<const T*>(config_, layout, base)); break;
    case Kind::kBlock:
      blocks_[static_cast<std::size_t>(block_index(local))].read_weights_from(
          block_params<const T*>(config_, layout, range_.first + local - 1, base));
      break;
    case Kind::kHead: head_->read_weights_from(head_params<const T*>(config_, layout, base)); break;
  }
}

template <class T>
typename BasicStage<T>::LayerWeights BasicStage<T>::layer_weights(int local) {
  if (!half()) return {&layout_, values_.data(), {}, {}};
  if (packed_) return {&layout_, packed_values_.data(), {}, {}};
  refresh_half_weights();
  const LayerWindow& window = windows_[static_cast<std::size_t>(local)];
  LayerWeights weights{
      &window.layout, nullptr, BasicTensor<T>::uninitialized({window.layout.total()}, allocator()), {}};
  if constexpr (std::is_same_v<T, float>) {
    const bool bf16_products = current_gemm_precision() == GemmPrecision::kBf16;
    for (const WindowTensor& tensor : window.tensors) {
      const std::uint16_t* bits = half_values_.data() + tensor.stage_offset;
      float* widened = weights.window.data() + tensor.window_offset;
      if (bf16_products && tensor.gemm_only) {
        weights.bf16_matrices.add(widened, {bits, static_cast<std::size_t>(tensor.numel)});
      } else {
        from_half_bits(options_.format, bits, widened, tensor.numel);
      }
    }
  }
  weights.base = weights.window.data();
  point_layer(local, window.layout, weights.base);
  return weights;
}

template <class T>
void BasicStage<T>::round_to_format(BasicTensor<T>& tensor) const {
  if constexpr (std::is_same_v<T, float>) {
    if (half() && !tensor.empty()) pipeflow::round_to_format(options_.format, tensor.data(), tensor.numel());
  }
}

template <class T>
std::span<const T> BasicStage<T>::parameter(std::string_view name) const {
  require_matrices("parameter");
  return slice(values_.span(), layout_.at(name));
}

template <class T>
std::span<T> BasicStage<T>::gradient(std::string_view name) {
  return slice(grads_.span(), layout_.at(name));
}

template <class T>
std::span<const T> BasicStage<T>::gradient(std::string_view name) const {
  return slice(grads_.span(), layout_.at(name));
}

template <class T>
void BasicStage<T>::init_parameters(std::uint64_t seed) {
  require_matrices("init_parameters");
  nn::init_parameters(layout_, config_, seed, values_.span());
  compute_stale_ = true;
}

template <class T>
void BasicStage<T>::copy_parameters_from(const BasicStage& source) {
  require_matrices("copy_parameters_from");
  if (!(source.config_ == config_)) fail("{}: cannot copy parameters from a model of another shape", where());
  for (const ParameterInfo& info : layout_.entries()) {
    const auto from = source.parameter(info.name);
    if (source.layout_.at(info.name).shape == info.shape) {
      std::copy(from.begin(), from.end(), parameter(info.name).begin());
    } else if (source.layout_.at(info.name).shape == info.whole) {
      copy_part<T>(info, from, parameter(info.name));
    } else {
      fail("{}: cannot copy {} from a stage split another way", where(), info.name);
    }
  }
}

// --- Checks ---

template <class T>
void BasicStage<T>::require_matrices(const char* what) const {
  if (packed_) {
    fail("{}: {} needs the weight matrices, but pack_for_inference has rearranged them into panels for decoding: "
         "use a stage that was not packed",
         where(), what);
  }
}

template <class T>
void BasicStage<T>::require_whole(const char* what) const {
  if (split()) {
    fail("{}: {} needs the whole layers, and this stage is split over {} tensor-parallel ranks: use a stage that "
         "is not split (tensor_parallel 1)",
         where(), what, options_.tensor->size());
  }
}

template <class T>
void BasicStage<T>::check_tokens(const IntTensor& tokens, const char* what, const LayerShape& shape) const {
  if (tokens.empty() || tokens.shape().rank() != 2) {
    fail("{}: needs {} as an int32 tensor [B, T], got {}", where(), what, shape_text(tokens.shape()));
  }
  if (tokens.dim(0) != shape.b || tokens.dim(1) != shape.t) {
    fail("{}: {} have shape {}, expected [{}, {}]", where(), what, shape_text(tokens.shape()), shape.b, shape.t);
  }
  for (std::int64_t i = 0; i < tokens.numel(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      fail("{}: {} [{}, {}] = {} is outside the vocabulary [0, {})", where(), what, i / shape.t, i % shape.t,
           tokens[i], config_.vocab_size);
    }
  }
}

// The kernels and BLAS index a tensor with int: every activation of one
// batch must hold fewer than 2^31 elements. `batch` says what made it.
template <class T>
void BasicStage<T>::check_tensor_sizes(std::initializer_list<std::pair<const char*, std::int64_t>> largest,
                                       std::string_view batch, std::string_view fix) const {
  for (const auto& [what, elements] : largest) {
    if (elements >= (std::int64_t{1} << 31)) {
      fail("{}: {} makes {} {} elements, over the 2^31 - 1 that the kernels and BLAS index: {}", where(), batch,
           what, elements, fix);
    }
  }
}

// A training micro-batch: the MLP's [B, T, 4C], the attention scores
// [B, NH, T, T], the logits [B, T, V].
template <class T>
void BasicStage<T>::check_tensor_sizes(const LayerShape& shape) const {
  const std::int64_t rows = static_cast<std::int64_t>(shape.b) * shape.t;
  check_tensor_sizes({{config_.llama() ? "the MLP's gate and up [B, T, 2F]" : "the MLP's [B, T, 4C]",
                       rows * (config_.llama() ? 2 * config_.ffn() : 4 * shape.c)},
                      {"the attention scores [B, NH, T, T]", rows * shape.nh * shape.t},
                      {"the logits [B, T, V]", rows * shape.v}},
                     fmt::format("a micro-batch of {} x {} tokens", shape.b, shape.t),
                     "lower train_micro_batch_size_per_gpu or the sequence length");
}

template <class T>
LayerShape BasicStage<T>::check_input(const Input& input, bool with_targets) const {
  LayerShape shape{0, 0, config_.n_embd, config_.n_head, config_.vocab_size};
  if (has_embedding()) {
    if (!input.activation.empty()) fail("{}: holds the embedding and takes tokens, not an activation", where());
    if (input.tokens.shape().rank() != 2) {
      fail("{}: needs tokens as an int32 tensor [B, T], got {}", where(), shape_text(input.tokens.shape()));
    }
    shape.b = static_cast<int>(input.tokens.dim(0));
    shape.t = static_cast<int>(input.tokens.dim(1));
    check_tokens(input.tokens, "tokens", shape);
  } else {
    const Shape& s = input.activation.shape();
    if (!input.tokens.empty()) fail("{}: takes the previous stage's activation, not tokens", where());
    if (input.activation.empty() || s.rank() != 3 || s[2] != config_.n_embd) {
      fail("{}: needs an activation [B, T, {}] from the previous stage, got {}", where(), config_.n_embd,
           shape_text(s));
    }
    shape.b = static_cast<int>(s[0]);
    // Sequence parallelism: the previous stage sent this rank's positions.
    shape.t = static_cast<int>(s[1]) * (sequence_split() ? options_.tensor->size() : 1);
  }
  if (sequence_split() && shape.t % options_.tensor->size() != 0) {
    fail("{}: sequence length {} is not a multiple of tensor_parallel {}: sequence parallelism splits each sequence "
         "over the tensor-parallel ranks",
         where(), shape.t, options_.tensor->size());
  }
  if (shape.t > config_.context) {
    fail("{}: sequence length {} exceeds the model's context of {}", where(), shape.t, config_.context);
  }
  check_tensor_sizes(shape);
  if (has_head() && with_targets) {
    check_tokens(input.targets, "targets", shape);
  } else if (!input.targets.empty()) {
    fail("{}: does not hold the head and takes no targets", where());
  }
  return shape;
}

template <class T>
void BasicStage<T>::require_phase(const State& state, typename State::Phase phase, const char* pass) const {
  if (state.phase_ == phase) return;
  static constexpr const char* kNeeds[] = {"a fresh (or fully backpropagated) state", "a completed forward",
                                           "a completed backward_input"};
  fail("{}: {} needs {} for this micro-batch", where(), pass, kNeeds[static_cast<int>(phase)]);
}

// --- Layers, local index 0 … size − 1 ---

template <class T>
typename BasicStage<T>::Kind BasicStage<T>::kind(int local) const {
  const int layer = range_.first + local;
  if (layer == 0) return Kind::kEmbedding;
  if (layer == config_.n_layer + 1) return Kind::kHead;
  return Kind::kBlock;
}

template <class T>
int BasicStage<T>::block_index(int local) const {
  return range_.first + local - std::max(range_.first, 1);
}

template <class T>
RoundAhead BasicStage<T>::round_ahead(bool stashed_after) const {
  return std::is_same_v<T, float> && stashed_after && gemm_precision_ == GemmPrecision::kBf16 ? RoundAhead::kYes
                                                                                                : RoundAhead::kNo;
}

template <class T>
typename BasicStage<T>::Flow BasicStage<T>::forward_layer(State& state, int local, Flow flow, bool stashed_after) {
  const LayerWeights weights = layer_weights(local);
  switch (kind(local)) {
    case Kind::kEmbedding: {
      Flow out{{}, embedding_->forward(state.embedding_, std::move(flow.tokens), state.shape_, allocator())};
      round_to_format(out.x);
      return out;
    }
    case Kind::kBlock: {
      const int i = block_index(local);
      Flow out{{}, blocks_[static_cast<std::size_t>(i)].forward(state.blocks_[static_cast<std::size_t>(i)],
                                                                std::move(flow.x), state.shape_, allocator(),
                                                                round_ahead(stashed_after))};
      round_to_format(out.x);
      return out;
    }
    case Kind::kHead:
      state.loss_ = head_->forward(state.head_, std::move(flow.x), state.targets_, state.shape_, allocator());
      return {};
  }
  return {};
}

// Keeps the layer's input if it starts a segment of recompute_interval
// layers, and drops everything else the layer saved.
template <class T>
void BasicStage<T>::checkpoint_layer(State& state, int local) {
  const bool starts_segment = local % options_.recompute_interval == 0;
  switch (kind(local)) {
    case Kind::kEmbedding:
      if (starts_segment) state.checkpoints_.push_back({std::move(state.embedding_.tokens), {}});
      state.embedding_ = {};
      break;
    case Kind::kBlock: {
      auto& saved = state.blocks_[static_cast<std::size_t>(block_index(local))];
      if (starts_segment) state.checkpoints_.push_back({{}, std::move(saved.x)});
      saved = {};
      break;
    }
    case Kind::kHead:
      if (starts_segment) state.checkpoints_.push_back({{}, std::move(state.head_.x)});
      state.head_ = {};
      break;
  }
}

// What layer `local` saved for this micro-batch (its EmbeddingSaved,
// BlockSaved or HeadSaved), handed to `f`.
template <class T>
template <class F>
void BasicStage<T>::with_saved(State& state, int local, F&& f) {
  switch (kind(local)) {
    case Kind::kEmbedding: f(state.embedding_); break;
    case Kind::kBlock: f(state.blocks_[static_cast<std::size_t>(block_index(local))]); break;
    case Kind::kHead: f(state.head_); break;
  }
}

template <class T>
void BasicStage<T>::stash_layer(State& state, int local, bool weight_pass_follows) {
  if (!half()) return;
  with_saved(state, local, [&](auto& saved) {
    auto tensors = saved.half_tensors();
    auto reads = saved.weight_pass_reads();
    using Tensors = typename HalfStash<T>::Tensors;
    saved.stash.pack(options_.format, tensors, allocator(), weight_pass_follows ? Tensors(reads) : Tensors(),
                     gemm_precision_ == GemmPrecision::kBf16);
  });
}

template <class T>
void BasicStage<T>::unstash_for_input(State& state, int local, Bf16Operands& stashed) {
  with_saved(state, local, [&](auto& saved) {
    auto tensors = saved.half_tensors();
    auto reads = saved.input_pass_reads();
    auto gemm_reads = saved.input_pass_gemm_reads();
    auto read_again = saved.weight_pass_reads();
    saved.stash.unpack(tensors, reads, read_again, allocator());
    if (gemm_precision_ == GemmPrecision::kBf16) {
      // Only those still packed: their stand-ins come from a pool nothing
      // else draws from, so the block may free them while `stashed` lives;
      // one holding floats of its own (recomputed) is left to its GEMMs.
      decltype(gemm_reads) packed{};
      std::size_t count = 0;
      for (BasicTensor<T>* tensor : gemm_reads) {
        if (tensor->empty()) packed[count++] = tensor;
      }
      saved.stash.lend(tensors, std::span(packed.data(), count), {&stand_in_pool_, nullptr}, stashed);
    } else {
      saved.stash.unpack(tensors, gemm_reads, read_again, allocator());
    }
  });
}

template <class T>
void BasicStage<T>::unstash_for_weight(State& state, int local, Bf16Operands& stashed) {
  with_saved(state, local, [&](auto& saved) {
    auto tensors = saved.half_tensors();
    if (gemm_precision_ != GemmPrecision::kBf16) {
      saved.stash.unpack(tensors, tensors, {}, allocator());
      return;
    }
    auto reads = saved.weight_pass_reads();
    saved.stash.unpack(tensors, reads, tensors, allocator());
    saved.stash.lend(tensors, tensors, {&stand_in_pool_, nullptr}, stashed);
  });
}

template <class T>
void BasicStage<T>::end_microbatch(State& state) {
  const double loss = state.loss_;
  state = State();
  state.loss_ = loss;
}

template <class T>
void BasicStage<T>::recompute_segment(State& state, int segment) {
  auto& checkpoint = state.checkpoints_[static_cast<std::size_t>(segment)];
  Flow flow{std::move(checkpoint.tokens), std::move(checkpoint.x)};
  const int first = segment * options_.recompute_interval;
  const int last = std::min(first + options_.recompute_interval, range_.size());
  for (int local = first; local < last; ++local) flow = forward_layer(state, local, std::move(flow));
}

// --- Passes ---

template <class T>
BasicTensor<T> BasicStage<T>::forward(State& state, Input input) {
  require_matrices("forward");
  require_phase(state, State::Phase::kEmpty, "forward");
  const GemmPrecisionScope precision(gemm_precision_);
  state.shape_ = check_input(input, true);
  input.tokens.charge_to(&activation_memory_);
  input.activation.charge_to(&activation_memory_);
  input.targets.charge_to(&activation_memory_);
  state.targets_ = std::move(input.targets);
  state.blocks_.resize(blocks_.size());
  Flow flow{std::move(input.tokens), std::move(input.activation)};
  for (int local = 0; local < range_.size(); ++local) {
    flow = forward_layer(state, local, std::move(flow), !checkpointing());
    if (checkpointing()) {
      checkpoint_layer(state, local);  // nothing is left to stash: the backward recomputes it
    } else {
      stash_layer(state, local, false);
    }
  }
  state.phase_ = State::Phase::kForward;
  return std::move(flow.x);
}

template <class T>
BasicTensor<T> BasicStage<T>::input_pass(State& state, BasicTensor<T> grad, double loss_scale,
                                         bool weight_pass_follows) {
  const GemmPrecisionScope precision(gemm_precision_);
  for (int local = range_.size() - 1; local >= 0; --local) {
    const int k = options_.recompute_interval;
    if (checkpointing() && (local % k == k - 1 || local == range_.size() - 1)) recompute_segment(state, local / k);
    {
      // What I's bf16 GEMMs read as their 16 bits: gone before the stash
      // and W free and draw stand-ins.
      Bf16Operands stashed;
      unstash_for_input(state, local, stashed);
      // The embedding's I reads no weights.
      const LayerWeights weights = kind(local) == Kind::kEmbedding ? LayerWeights{} : layer_weights(local);
      switch (kind(local)) {
        case Kind::kHead:
          grad = head_->backward_input(state.head_, state.targets_, loss_scale, state.shape_, allocator());
          round_to_format(grad);
          break;
        case Kind::kBlock: {
          const auto i = static_cast<std::size_t>(block_index(local));
          grad = blocks_[i].backward_input(state.blocks_[i], std::move(grad), state.shape_, allocator(),
                                           round_ahead(true));
          round_to_format(grad);
          break;
        }
        case Kind::kEmbedding:
          embedding_->backward_input(state.embedding_, std::move(grad), state.shape_, allocator());
          break;
      }
    }
    stash_layer(state, local, weight_pass_follows);  // what W reads, in the format
    if (weight_pass_follows) weight_layer(state, local);  // what it read is freed before the next layer's I
  }
  if (weight_pass_follows) {
    end_microbatch(state);
    return grad;
  }
  state.checkpoints_.clear();
  state.targets_.reset();  // W does not need them
  state.phase_ = State::Phase::kInputGrad;
  return grad;
}

template <class T>
BasicTensor<T> BasicStage<T>::input_pass_from_output(State& state, BasicTensor<T> grad_output,
                                                     bool weight_pass_follows) {
  require_phase(state, State::Phase::kForward, "backward_input");
  if (has_head()) fail("{}: holds the head: its backward starts at the loss (backward_input_from_loss)", where());
  const LayerShape& s = state.shape_;
  if (!(grad_output.shape() == Shape{s.b, positions_held(s.t), s.c})) {
    fail("{}: gradient of the output has shape {}, expected [{}, {}, {}]", where(), shape_text(grad_output.shape()),
         s.b, positions_held(s.t), s.c);
  }
  grad_output.charge_to(&activation_memory_);
  return input_pass(state, std::move(grad_output), 1.0, weight_pass_follows);
}

template <class T>
BasicTensor<T> BasicStage<T>::input_pass_from_loss(State& state, double loss_scale, bool weight_pass_follows) {
  require_phase(state, State::Phase::kForward, "backward_input_from_loss");
  if (!has_head()) fail("{}: does not hold the head: its backward takes the next stage's gradient", where());
  return input_pass(state, {}, loss_scale, weight_pass_follows);
}

template <class T>
BasicTensor<T> BasicStage<T>::backward_input(State& state, BasicTensor<T> grad_output) {
  return input_pass_from_output(state, std::move(grad_output), false);
}

template <class T>
BasicTensor<T> BasicStage<T>::backward_input_from_loss(State& state, double loss_scale) {
  return input_pass_from_loss(state, loss_scale, false);
}

template <class T>
void BasicStage<T>::backward_weight(State& state) {
  require_phase(state, State::Phase::kInputGrad, "backward_weight");
  const GemmPrecisionScope precision(gemm_precision_);
  for (int local = range_.size() - 1; local >= 0; --local) weight_layer(state, local);
  end_microbatch(state);
}

template <class T>
void BasicStage<T>::weight_layer(State& state, int local) {
  // Lives until W has run: its GEMMs read the stashed bits through it. W
  // frees the layer's saved tensors as it ends, after its last GEMM.
  Bf16Operands stashed;
  unstash_for_weight(state, local, stashed);
  switch (kind(local)) {
    case Kind::kHead:
      head_->backward_weight(state.head_, state.shape_);
      break;
    case Kind::kBlock: {
      const auto i = static_cast<std::size_t>(block_index(local));
      blocks_[i].backward_weight(state.blocks_[i], state.shape_);
      break;
    }
    case Kind::kEmbedding:
      embedding_->backward_weight(state.embedding_, state.shape_);
      break;
  }
}

// Fused: each layer's W runs right after its I (the same order of the
// weight-gradient sums as I over every layer, then W), so what a layer's W
// reads is freed before the next layer's I and never stashed.
template <class T>
BasicTensor<T> BasicStage<T>::backward(State& state, BasicTensor<T> grad_output) {
  return input_pass_from_output(state, std::move(grad_output), true);
}

template <class T>
BasicTensor<T> BasicStage<T>::backward_from_loss(State& state, double loss_scale) {
  return input_pass_from_loss(state, loss_scale, true);
}

template <class T>
BasicTensor<T> BasicStage<T>::logits(const IntTensor& tokens) {
  require_matrices("logits");
  require_whole("logits");
  if (!has_embedding() || !has_head()) fail("{}: logits need a stage holding the whole model", where());
  State state;
  Input input;
  input.tokens = tokens.clone();
  state.shape_ = check_input(input, false);
  state.blocks_.resize(blocks_.size());
  Flow flow{std::move(input.tokens), {}};
  for (int local = 0; local + 1 < range_.size(); ++local) {
    flow = forward_layer(state, local, std::move(flow));
    state.embedding_ = {};  // inference keeps nothing
    for (auto& saved : state.blocks_) saved = {};
  }
  const LayerWeights head = layer_weights(range_.size() - 1);
  return head_->logits(flow.x, state.shape_, allocator());
}

// --- Inference with a key/value cache ---

template <class T>
BasicKvCache<T> BasicStage<T>::make_kv_cache(int sequences) const {
  const int parts = split() ? options_.tensor->size() : 1;  // the rank's key/value heads
  return BasicKvCache<T>(static_cast<int>(blocks_.size()), sequences, config_.context,
                         config_.kv_heads() / parts * config_.head_size(), options_.name);
}

template <class T>
LayerShape BasicStage<T>::check_cached_input(const BasicKvCache<T>& cache, const SequenceRows& rows,
                                             const Input& input) const {
  if (cache.blocks() != static_cast<int>(blocks_.size()) || cache.context() != config_.context) {
    fail("{}: the kv cache was made for {} blocks and context {}, this stage has {} and {}", where(), cache.blocks(),
         cache.context(), blocks_.size(), config_.context);
  }
  if (rows.counts.empty()) fail("{}: an inference batch needs at least one sequence", where());
  if (rows.first < 0 || rows.first + static_cast<int>(rows.counts.size()) > cache.sequences()) {
    fail("{}: sequences {}..{} are outside the kv cache's {}", where(), rows.first,
         rows.first + static_cast<int>(rows.counts.size()) - 1, cache.sequences());
  }
  for (std::size_t i = 0; i < rows.counts.size(); ++i) {
    const int sequence = rows.first + static_cast<int>(i);
    if (rows.counts[i] < 1) {
      fail("{}: sequence {} has {} new positions, needs at least 1", where(), sequence, rows.counts[i]);
    }
    if (cache.length(sequence) + rows.counts[i] > config_.context) {
      fail("{}: sequence {} would hold {} + {} positions, over the model's context of {}", where(), sequence,
           cache.length(sequence), rows.counts[i], config_.context);
    }
  }
  const LayerShape shape{1, rows.total(), config_.n_embd, config_.n_head, config_.vocab_size};
  if (!input.targets.empty()) fail("{}: inference takes no targets", where());
  if (has_embedding()) {
    check_tokens(input.tokens, "tokens", shape);
  } else if (!(input.activation.shape() == Shape{1, shape.t, shape.c})) {
    fail("{}: needs an activation [1, {}, {}] from the previous stage, got {}", where(), shape.t, shape.c,
         shape_text(input.activation.shape()));
  }
  // The sequences' rows share the MLP's [1, R, 4C]; attention runs one
  // sequence at a time ([its new rows, its positions]); the head's logits
  // are each sequence's last row's.
  std::int64_t scores = 0;
  for (std::size_t i = 0; i < rows.counts.size(); ++i) {
    const std::int64_t count = rows.counts[i];
    scores = std::max(scores, count * (cache.length(rows.first + static_cast<int>(i)) + count));
  }
  const std::int64_t sequences = static_cast<std::int64_t>(rows.counts.size());
  check_tensor_sizes({{config_.llama() ? "the MLP's gate and up [1, R, 2F]" : "the MLP's [1, R, 4C]",
                       static_cast<std::int64_t>(shape.t) * (config_.llama() ? 2 * config_.ffn() : 4 * shape.c)},
                      {"a sequence's attention scores [T, past + T]", scores},
                      {"the logits [S, V]", sequences * shape.v}},
                     fmt::format("an inference batch of {}, R = {} rows", format_count(sequences, "sequence"), shape.t),
                     "generate fewer prompts at once (more --microbatches) or shorter ones");
  return shape;
}

template <class T>
BasicTensor<T> BasicStage<T>::forward_cached(BasicKvCache<T>& cache, const SequenceRows& rows, Input input) {
  const LayerShape shape = check_cached_input(cache, rows, input);
  const int c = shape.c;
  BasicTensor<T> x = std::move(input.activation);
  x.charge_to(&activation_memory_);
  if (has_embedding()) {
    const LayerWeights weights = layer_weights(0);
    x = BasicTensor<T>::uninitialized({1, shape.t, c}, allocator());
    const T* wte = weights.at(config_.embedding_name());
    const T* wpe = config_.llama() ? nullptr : weights.at("wpe.weight");
    if (split()) embedding_->lookup_split(x.data(), input.tokens.data(), shape.t, shape);
    int row = 0;
    for (std::size_t i = 0; i < rows.counts.size(); ++i) {
      const int past = cache.length(rows.first + static_cast<int>(i));
      T* out = x.data() + static_cast<long>(row) * c;
      if (!split()) {
        embedding_forward(out, input.tokens.data() + row, wte, wpe == nullptr ? wpe : wpe + static_cast<long>(past) * c,
                          1, rows.counts[i], c);
      } else if (wpe != nullptr) {  // the positions after the vocabulary-parallel lookup
        const T* position = wpe + static_cast<long>(past) * c;
        for (long j = 0; j < static_cast<long>(rows.counts[i]) * c; ++j) out[j] += position[j];
      }
      row += rows.counts[i];
    }
  }
  round_to_format(x);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const LayerWeights weights = layer_weights(static_cast<int>(i) + (has_embedding() ? 1 : 0));
    x = blocks_[i].forward_cached(std::move(x), cache, static_cast<int>(i), rows, shape, allocator());
    round_to_format(x);
  }
  for (std::size_t i = 0; i < rows.counts.size(); ++i) cache.advance(rows.first + static_cast<int>(i), rows.counts[i]);
  if (!has_head()) return x;
  const int n = static_cast<int>(rows.counts.size());
  auto last_rows = BasicTensor<T>::uninitialized({1, n, c}, allocator());
  int row = 0;
  for (int i = 0; i < n; ++i) {
    row += rows.counts[static_cast<std::size_t>(i)];
    std::copy_n(x.data() + static_cast<long>(row - 1) * c, c, last_rows.data() + static_cast<long>(i) * c);
  }
  const LayerWeights head = layer_weights(range_.size() - 1);
  auto logits = head_->logits(last_rows, {1, n, c, shape.nh, shape.v}, allocator());
  logits.reshape({n, shape.v});
  return logits;
}

// --- Gradients ---

template <class T>
void BasicStage<T>::zero_gradients() {
  std::memset(grads_.data(), 0, static_cast<std::size_t>(grads_.bytes()));
}

template <class T>
double BasicStage<T>::gradient_square_sum(std::int64_t begin, std::int64_t end) const {
  double total = 0;
  for (const ParameterInfo& info : layout_.entries()) {
    if (info.name == config_.embedding_name() && !has_embedding()) continue;
    if (split() && !info.split() && options_.tensor->rank() != 0) continue;
    const std::int64_t from = std::max(begin, info.offset);
    const std::int64_t count = std::min(end, info.offset + info.numel()) - from;
    if (count <= 0) continue;
    const T* g = grads_.data() + from;
    double partial[16] = {};
    std::int64_t i = 0;
    for (; i + 16 <= count; i += 16) {
      for (int lane = 0; lane < 16; ++lane) partial[lane] += static_cast<double>(g[i + lane]) * g[i + lane];
    }
    for (; i < count; ++i) partial[0] += static_cast<double>(g[i]) * g[i];
    for (const double p : partial) total += p;
  }
  return total;
}

template <class T>
void BasicStage<T>::scale_gradients(double factor) {
  const T f = static_cast<T>(factor);
  for (T& g : grads_.span()) g *= f;
}

template <class T>
void BasicStage<T>::add_tied_gradient(std::span<const T> other) {
  auto mine = tied_gradient();
  if (other.size() != mine.size()) {
    fail("{}: the tied embedding's gradient ({}) has {} elements, expected {}", where(), config_.embedding_name(),
         other.size(), mine.size());
  }
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] += other[i];
}

template <class T>
void BasicStage<T>::pack_for_inference() {
  if (packed_) return;
  // The matrices the blocks read: a half-precision stage's rounded copy,
  // widened whole (once packed, nothing writes the parameters again).
  T* base = values_.data();
  if (half()) {
    refresh_half_weights();
    packed_values_ = BasicTensor<T>::uninitialized({layout_.total()}, {nullptr, &weight_memory_});
    if constexpr (std::is_same_v<T, float>) {
      from_half_bits(options_.format, half_values_.data(), packed_values_.data(), layout_.total());
    }
    base = packed_values_.data();
    for (int local = 0; local < range_.size(); ++local) point_layer(local, layout_, base);
  }
  const int first_block = std::max(range_.first, 1) - 1;  // as the constructor numbers them
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    blocks_[i].pack_weights(block_params<T*>(config_, layout_, first_block + static_cast<int>(i), base),
                            {0, 0, config_.n_embd, config_.n_head, config_.vocab_size});
  }
  packed_ = true;
}

template class BasicStage<float>;
template class BasicStage<double>;

}  // namespace pipeflow::nn
