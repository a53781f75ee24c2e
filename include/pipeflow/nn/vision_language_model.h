#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/nn/embedding_layer.h"
#include "pipeflow/nn/lm_head.h"
#include "pipeflow/nn/model_config.h"
#include "pipeflow/nn/parameter_layout.h"
#include "pipeflow/nn/patch_embedding.h"
#include "pipeflow/nn/projector.h"
#include "pipeflow/nn/shape_captions.h"
#include "pipeflow/nn/transformer_block.h"
#include "pipeflow/tensor/buffer_pool.h"
#include "pipeflow/tensor/memory_account.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// A LLaVA-style vision-language model, small: a CLIP vision encoder (its
// embeddings: patches, class token, positions, pre-LayerNorm; then `layers`
// GPT-2 blocks of its own width D and heads, without the causal mask, over
// the N + 1 positions), LLaVA-1.5's projector (D → C) over the N patch
// tokens of the last block (the class token dropped, LLaVA's
// vision_feature_select_strategy "default"), then a GPT-2 language model
// whose sequence is the N image tokens followed by T_c text tokens; the loss
// is the mean cross-entropy over the text positions only. `layers` counts
// the blocks run: LLaVA's vision_feature_layer picks them (model/hf_config.h).
struct VisionConfig {
  PatchGeometry geometry;
  int width = 32;  // D
  int heads = 4;
  int layers = 1;

  int tokens() const { return geometry.patches(); }  // N: the image tokens the language model takes
  int positions() const { return tokens() + 1; }     // N + 1: the encoder's sequence, the class token first
  bool operator==(const VisionConfig& other) const;
};

struct VlmConfig {
  VisionConfig vision;
  ModelConfig text;  // GPT-2's family

  // Throws Error naming the field, its value and the rule: the text model
  // valid and GPT-2's, the image a whole number of patches, D a multiple of
  // the heads, the LM's context (text.context) above the N image tokens.
  void validate() const;
  // vision.patch_embedding (0), vision.block.0 … vision.block.{Lv−1}, projector, embedding, block.0
  // … block.{L−1}, head.
  int pipeline_layers() const { return vision.layers + 2 + text.pipeline_layers(); }
  int projector_layer() const { return vision.layers + 1; }
  int embedding_layer() const { return vision.layers + 2; }  // the LM's first
  int head_layer() const { return pipeline_layers() - 1; }
  bool operator==(const VlmConfig&) const = default;
};

// "vision.patch_embedding", "vision.block.0", "projector", "embedding", "block.1", "head"
// (the model module's names of a vision-language model's pipeline layers).
std::string vlm_layer_name(const VlmConfig& config, int layer);

// The activation a stage whose first layer is `layer` (> 0) takes, the
// output of the layer before: [B, N + 1, D] into the encoder's blocks and
// the projector, [B, N, C] into the LM's embedding, [B, N + T_c, C] after it.
Shape vlm_activation_shape(const VlmConfig& config, int layer, int batch, int text_tokens);

// The parameters of a range of the model's layers, in model order, with
// GPT-2's names for the language model and these for the rest (CLIP's
// names under vision. for the embeddings, as transformers' CLIPVisionModel
// has them under vision_model.):
//   vision.patch_embedding: vision.embeddings.patch_embedding.weight [F, D],
//                    vision.embeddings.class_embedding [D],
//                    vision.embeddings.position_embedding.weight [N + 1, D],
//                    vision.pre_layrnorm.{weight, bias} [D]
//   vision.block.i:  vision.h.i.<a GPT-2 block's tensors> of width D
//   projector:       projector.fc1.{weight [D, C], bias [C]},
//                    projector.fc2.{weight [C, C], bias [C]}
// A head range without the embedding holds its own copy of the tied wte.
ParameterLayout vlm_layout(const VlmConfig& config, LayerRange range);

// LoRA (Hu et al. 2021) on the language model's attention input projection
// (GPT-2's fused c_attn, q | k | v): c_attn's weight W [C, 3C] acts as
// W + (alpha / r) · A · B with A [C, r] = h.i.attn.c_attn.lora_A (GPT-2's
// init, N(0, 0.02)) and B [r, 3C] = h.i.attn.c_attn.lora_B (zeros, so
// training starts from the base model). No decay on the adapters.
struct LoraOptions {
  int r = 4;
  double alpha = 8;
  double scale() const { return alpha / r; }
  bool operator==(const LoraOptions&) const = default;
};

struct VlmStageOptions {
  std::string name = "stage";
  // The vision encoder (patch embedding and ViT blocks) is not trained: its
  // layers run no weight pass, hold no gradients and no optimizer state
  // (their tensors are in frozen_layout(), not layout()). The projector and
  // the language model train.
  bool freeze_vision = false;
  // The language model's tensors frozen (frozen_layout()) and LoRA adapters
  // trained on each block's c_attn. The blocks multiply by the merged
  // weight W + s·A·B (refreshed before each forward), and the adapters'
  // gradients come from the merged weight's, dA = s·dW·Bᵀ and dB = s·Aᵀ·dW
  // (exact; the weight pass costs the full c_attn's FLOPs, the adapters hold
  // the only gradients and optimizer state). The projector still trains.
  std::optional<LoraOptions> lora = std::nullopt;
};

// A stage's tensors of a range of layers (vlm_layout's) split as options
// train them: the frozen encoder's and, under LoRA, the language model's
// base tensors in `frozen`; the rest in `trained`, followed under LoRA by
// each block's adapters (h.i.attn.c_attn.lora_A [C, r], lora_B [r, 3C]).
struct VlmStageLayouts {
  ParameterLayout trained;
  ParameterLayout frozen;
};
VlmStageLayouts vlm_stage_layouts(const VlmConfig& config, LayerRange range, const VlmStageOptions& options);

// What a VLM stage's forward consumes; move the tensors in.
template <class T>
struct BasicVlmInput {
  BasicTensor<T> images = {};      // [B, channels, H, W]: the stage holding the patch embedding
  BasicTensor<T> activation = {};  // the previous stage's output: every other stage
  IntTensor tokens = {};           // [B, T_c] text tokens: the stage holding the LM's embedding
  IntTensor targets = {};          // [B, T_c] next text tokens: the stage holding the head
};

template <class T>
class BasicVlmStage;

// One micro-batch's saved tensors on one VLM stage, as BasicMicrobatchState.
template <class T>
class BasicVlmState {
 public:
  enum class Phase { kEmpty, kForward, kInputGrad };

  BasicVlmState() = default;
  BasicVlmState(BasicVlmState&&) noexcept = default;
  BasicVlmState& operator=(BasicVlmState&&) noexcept = default;

  Phase phase() const { return phase_; }
  // The mean cross-entropy over the B·T_c text positions (head stage; NaN elsewhere).
  double loss() const { return loss_; }

 private:
  friend class BasicVlmStage<T>;
  struct JoinSaved {  // the LM's embedding with the image tokens in front
    IntTensor tokens;   // [B, T_c]
    BasicTensor<T> dx;  // [B, N + T_c, C], from I
  };

  Phase phase_ = Phase::kEmpty;
  double loss_ = std::numeric_limits<double>::quiet_NaN();
  LayerShape vision_;  // {B, N + 1, D, vision heads, 0}
  LayerShape text_;    // {B, N + T_c, C, n_head, V}
  IntTensor targets_;
  PatchEmbeddingSaved<T> patch_;
  std::vector<BlockSaved<T>> vit_;
  ProjectorSaved<T> projector_;
  JoinSaved join_;
  std::vector<BlockSaved<T>> blocks_;
  HeadSaved<T> head_;
};

// A contiguous range of a VLM's pipeline layers with its parameters and
// gradients (one buffer each, laid out by vlm_layout; with freeze_vision the
// encoder's tensors in a third buffer that has no gradient), a buffer pool
// and the two memory accounts of nn::Stage. Per micro-batch: forward →
// backward_input → backward_weight, or forward → backward; gradients
// accumulate until zero_gradients(), as nn::Stage's (docs/NN.md).
//
// What passes between stages (vlm_activation_shape): after the patch
// embedding and each ViT block [B, N + 1, D]; after the projector
// [B, N, C]; from the LM's embedding on [B, N + T_c, C]. The stage holding the LM's embedding takes the text
// tokens, the head's stage the targets, the first stage the images.
//
// Tied embedding: as nn::Stage's (needs_tied_reduction, tied_gradient,
// add_tied_gradient).
//
// Thread safety: as nn::Stage's.
template <class T>
class BasicVlmStage {
 public:
  using State = BasicVlmState<T>;
  using Input = BasicVlmInput<T>;

  BasicVlmStage(const VlmConfig& config, LayerRange layers, VlmStageOptions options = {});
  BasicVlmStage(const BasicVlmStage&) = delete;
  BasicVlmStage& operator=(const BasicVlmStage&) = delete;

  const VlmConfig& config() const { return config_; }
  LayerRange layers() const { return range_; }
  const VlmStageOptions& options() const { return options_; }
  bool has_layer(int layer) const { return range_.first <= layer && layer < range_.last; }
  bool has_images() const { return range_.first == 0; }
  bool has_text_embedding() const { return has_layer(config_.embedding_layer()); }
  bool has_head() const { return range_.last == config_.pipeline_layers(); }

  // --- Parameters ---
  // The trained tensors (parameters() and gradients() in this layout) and,
  // with freeze_vision, the frozen ones (frozen_parameters()).
  const ParameterLayout& layout() const { return layout_; }
  const ParameterLayout& frozen_layout() const { return frozen_layout_; }
  std::span<T> parameters() { return values_.span(); }
  std::span<const T> parameters() const { return values_.span(); }
  std::span<T> gradients() { return grads_.span(); }
  std::span<const T> gradients() const { return grads_.span(); }
  std::span<const T> frozen_parameters() const { return frozen_values_.span(); }
  // One tensor by name, trained or frozen (Error if the stage holds neither).
  std::span<T> parameter(std::string_view name);
  std::span<const T> parameter(std::string_view name) const;
  std::span<T> gradient(std::string_view name);
  std::span<const T> gradient(std::string_view name) const;
  // GPT-2's initialisation (init_parameters) of every tensor by name: the
  // same values for a tensor whatever range holds it, frozen or not.
  void init_parameters(std::uint64_t seed);
  // Every tensor of this stage from `source` by name; LoRA adapters that
  // `source` does not have keep their values (a base model's copy).
  void copy_parameters_from(const BasicVlmStage& source);

  // --- One micro-batch ---
  // The output for the next stage, or empty on the head's stage.
  BasicTensor<T> forward(State& state, Input input);
  BasicTensor<T> backward_input(State& state, BasicTensor<T> grad_output);
  BasicTensor<T> backward_input_from_loss(State& state, double loss_scale);
  void backward_weight(State& state);
  BasicTensor<T> backward(State& state, BasicTensor<T> grad_output);
  BasicTensor<T> backward_from_loss(State& state, double loss_scale);

  // Inference on a stage holding the whole model: the logits [B, T_c, V] of
  // the text positions, for images [B, channels, H, W] and tokens [B, T_c].
  BasicTensor<T> logits(BasicTensor<T> images, IntTensor tokens);

  // --- Between the last micro-batch and the optimizer step ---
  void zero_gradients();
  // Σ g² over gradient elements [begin, end) (a data-parallel replica's
  // part), the head's copy of the tied wte left out when the embedding is elsewhere.
  double gradient_square_sum() const { return gradient_square_sum(0, layout_.total()); }
  double gradient_square_sum(std::int64_t begin, std::int64_t end) const;
  void scale_gradients(double factor);
  // The LM's embedding and head on different stages, wte trained (not under LoRA).
  bool needs_tied_reduction() const { return !options_.lora && has_text_embedding() != has_head(); }
  std::span<T> tied_gradient() { return gradient("wte.weight"); }
  void add_tied_gradient(std::span<const T> other);

  MemoryAccount& activation_memory() { return activation_memory_; }
  MemoryAccount& weight_memory() { return weight_memory_; }
  Allocator allocator() { return {&pool_, &activation_memory_}; }

 private:
  enum class Kind { kPatch, kVit, kProjector, kEmbedding, kBlock, kHead };
  Kind kind(int layer) const;
  std::string where() const;
  // A frozen encoder's layer: no I, no W (nothing below it trains).
  bool frozen(int layer) const { return options_.freeze_vision && layer < config_.projector_layer(); }
  // A layer without a W pass: a frozen encoder's, and the LM's embedding
  // and head under LoRA (their I still runs, for the projector).
  bool skips_weight_pass(int layer) const {
    return frozen(layer) || (options_.lora && (kind(layer) == Kind::kEmbedding || kind(layer) == Kind::kHead));
  }
  // LoRA: merged_ = W + s·A·B for every block; after a block's W pass its
  // merged weight's gradient into dA and dB (then zeroed).
  void merge_adapters();
  void adapter_gradients(int block);
  void check_input(State& state, const Input& input) const;
  BasicTensor<T> forward_layer(State& state, int layer, BasicTensor<T> x, IntTensor& tokens);
  BasicTensor<T> input_layer(State& state, int layer, BasicTensor<T> grad, double loss_scale);
  void weight_layer(State& state, int layer);
  BasicTensor<T> input_pass(State& state, BasicTensor<T> grad, double loss_scale, bool weight_pass_follows);
  // I (and W when it follows) from the output's gradient or the loss, after
  // checking the phase and the stage; `pass` names the caller in errors.
  BasicTensor<T> input_pass_from_output(State& state, BasicTensor<T> grad_output, bool weight_pass_follows,
                                        const char* pass);
  BasicTensor<T> input_pass_from_loss(State& state, double loss_scale, bool weight_pass_follows, const char* pass);
  // Empties the state after W, keeping the micro-batch's loss.
  void end_microbatch(State& state);
  // Positions [first, first + count) of each sequence of x [B, T, width],
  // and the reverse: them in place in a [B, positions, width] of zeros.
  BasicTensor<T> take_positions(const BasicTensor<T>& x, int first, int count);
  BasicTensor<T> place_positions(const BasicTensor<T>& x, int first, int positions);
  // The LM's embedding with the image tokens x [B, N, C] in front.
  BasicTensor<T> join_forward(State& state, BasicTensor<T> x, IntTensor tokens);
  BasicTensor<T> join_backward_input(State& state, BasicTensor<T> dx);
  void join_backward_weight(State& state);

  VlmConfig config_;
  LayerRange range_;
  VlmStageOptions options_;
  ParameterLayout layout_;
  ParameterLayout frozen_layout_;
  MemoryAccount weight_memory_;
  MemoryAccount activation_memory_;
  BufferPool pool_;
  BasicTensor<T> values_;
  BasicTensor<T> grads_;
  BasicTensor<T> frozen_values_;
  // LoRA: the frozen tensors' gradients the blocks' W pass writes (only the
  // merged c_attn's is read), and the merged c_attn of each block [C, 3C].
  BasicTensor<T> frozen_grads_;
  BasicTensor<T> merged_;
  std::vector<int> block_numbers_;  // the LM's block index of each of blocks_
  std::optional<PatchEmbedding<T>> patch_;
  std::vector<TransformerBlock<T>> vit_;  // by ViT block index, from the range's first
  std::optional<Projector<T>> projector_;
  const T* wte_ = nullptr;  // the LM's embedding (the join's)
  const T* wpe_ = nullptr;
  T* d_wte_ = nullptr;
  T* d_wpe_ = nullptr;
  std::vector<TransformerBlock<T>> blocks_;
  std::optional<LmHead<T>> head_;
};

// Greedy captions of images [B, channels, H, W] by a whole model: from
// `start`, each next byte the most likely one, `bytes` of them per image.
std::vector<std::string> greedy_captions(BasicVlmStage<float>& model, const Tensor& images, std::int32_t start,
                                         int bytes);

// Greedy captions of held-out images (samples 0 … images − 1 of the
// validation split's step 0) by a whole model against their captions.
struct CaptionScore {
  int right = 0;  // captions equal to the image's, byte for byte
  int images = 0;
  // A model blind to the image: one of the 4 colours × 4 shapes, 1/16.
  static constexpr double kChance = 1.0 / (ShapeCaptions::kColours.size() * ShapeCaptions::kShapes.size());
  std::string expected;   // the first image's caption
  std::string generated;  // and the model's
};
CaptionScore score_captions(BasicVlmStage<float>& model, const ShapeCaptions& data, int images);

// The mean loss over held-out samples 0 … microbatches · batch − 1 of the
// validation split's step 0, by a whole model: forwarded `batch` samples at
// a time (each micro-batch's activations freed before the next), so it
// holds one micro-batch's activations however many it evaluates.
double held_out_loss(BasicVlmStage<float>& model, const ShapeCaptions& data, int microbatches, int batch);

using VlmStage = BasicVlmStage<float>;
using VlmState = BasicVlmState<float>;
using VlmInput = BasicVlmInput<float>;

extern template class BasicVlmStage<float>;
extern template class BasicVlmStage<double>;

}  // namespace pipeflow::nn
