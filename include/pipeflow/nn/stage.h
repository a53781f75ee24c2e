#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeflow/nn/embedding_layer.h"
#include "pipeflow/nn/model_config.h"
#include "pipeflow/nn/kv_cache.h"
#include "pipeflow/nn/lm_head.h"
#include "pipeflow/nn/parameter_layout.h"
#include "pipeflow/nn/tensor_group.h"
#include "pipeflow/nn/transformer_block.h"
#include "pipeflow/tensor/buffer_pool.h"
#include "pipeflow/tensor/gemm.h"
#include "pipeflow/tensor/half.h"
#include "pipeflow/tensor/memory_account.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

template <class T>
class BasicStage;

struct StageOptions {
  // DeepSpeed's activation_checkpoint_interval: 0 keeps every layer's
  // activations from forward to backward; k > 0 keeps only the input of the
  // first of every k consecutive layers of the stage and recomputes the k
  // layers' forward in backward_input (bit-identical results, less memory).
  int recompute_interval = 0;
  // Names the stage in errors and its memory accounts ("<name> activations",
  // "<name> weights").
  std::string name = "stage";
  // kBf16 / kFp16 (tensor/half.h): the layers multiply by a copy of the
  // weights rounded to the format, held in its 16 bits (2 bytes a parameter
  // beside the fp32 master weights and gradients) and refreshed from the
  // master weights after they change; each layer's part is widened exactly
  // into a window from the pool for the layer's pass (but for the matrices
  // a bf16 GEMM takes in their 16 bits). Every activation a
  // layer passes on (forward) and every gradient of one (backward) is
  // rounded to the format; the weight gradients accumulate in fp32. float
  // stages only.
  ComputeFormat format = ComputeFormat::kFp32;
  // kBf16: how the training passes (forward, I, W) multiply: through
  // oneDNN's bf16 matmul (the operands in bf16, fp32 accumulation and
  // results), or in fp32 on the rounded values (tensor/gemm.h; kAuto: bf16
  // where the CPU has bf16 instructions). Inference (logits, forward_cached)
  // multiplies in fp32. fp16 stages always multiply in fp32.
  Bf16Gemm bf16_gemm = Bf16Gemm::kAuto;
  // The tensor-parallel group the stage's layers are split over (Megatron-LM's
  // scheme: ParameterLayout says which part of each tensor the rank holds);
  // null: the stage holds its layers whole. It must outlive the stage.
  // float stages only; training only (logits, the kv cache and packing need
  // whole layers).
  TensorGroup* tensor = nullptr;
  // Megatron-LM's sequence parallelism beside `tensor` (ignored without it):
  // the activations between layers and stages are the rank's positions of
  // each sequence, [B, T/size, C] (T a multiple of the group's size); the
  // gradients of the whole (replicated) tensors are then each rank's part,
  // to be summed over the group before the update (the engine does).
  bool sequence_parallel = false;
};

// What a stage's forward consumes; move the tensors in.
template <class T>
struct BasicStageInput {
  IntTensor tokens = {};           // [B, T] int32 in [0, V): the stage holding the embedding
  BasicTensor<T> activation = {};  // [B, T, C]: every other stage (the previous stage's output)
  IntTensor targets = {};          // [B, T] int32 in [0, V): the stage holding the head
};

// Everything one micro-batch keeps on one stage between its passes: forward
// fills it, backward_input reduces it to what the weight pass needs,
// backward_weight empties it. One object per in-flight micro-batch; any number
// may be alive at once, and their weight passes may run in any order.
// Its tensors come from the stage's pool and are charged to the stage's
// activation account. Move-only; destroy it before its stage.
template <class T>
class BasicMicrobatchState {
 public:
  enum class Phase { kEmpty, kForward, kInputGrad };

  BasicMicrobatchState() = default;
  BasicMicrobatchState(BasicMicrobatchState&&) noexcept = default;
  BasicMicrobatchState& operator=(BasicMicrobatchState&&) noexcept = default;

  Phase phase() const { return phase_; }
  // The micro-batch's mean cross-entropy over its B·T positions: set by the
  // forward of the stage holding the head (NaN elsewhere), readable until the
  // state's next forward.
  double loss() const { return loss_; }

 private:
  friend class BasicStage<T>;
  struct Checkpoint {
    IntTensor tokens;
    BasicTensor<T> x;
  };

  Phase phase_ = Phase::kEmpty;
  LayerShape shape_;
  double loss_ = std::numeric_limits<double>::quiet_NaN();
  IntTensor targets_;
  EmbeddingSaved<T> embedding_;
  std::vector<BlockSaved<T>> blocks_;
  HeadSaved<T> head_;
  std::vector<Checkpoint> checkpoints_;
};

// One pipeline stage: a contiguous range of the pipeline layers (embedding,
// block.0 … block.{L−1}, head) with its own parameters and gradients (one
// contiguous buffer each, laid out by ParameterLayout in Hugging Face's names
// of the model's family), a buffer pool, and two memory accounts: activations
// (micro-batch states, outputs, temporaries) and weights (parameters,
// gradients and Llama's rotation tables; the optimizer adds its moments).
//
// Per micro-batch: forward → backward_input (I) → backward_weight (W), or
// forward → backward (B = I then W). Gradients accumulate over micro-batches
// until zero_gradients(). For the gradient of the mean loss over a global
// batch of m equal micro-batches on d data-parallel replicas, the head stage
// starts each backward with loss_scale = 1 / (m·d).
//
// Tied embedding (GPT-2 always, Llama when tied_embeddings): the token
// embedding (wte, model.embed_tokens) is also the LM head. When the
// embedding and the head are on different stages each holds a copy; before
// the optimizer step the runtime makes both gradients their sum (DeepSpeed's
// ReduceTiedGrads): exchange copies of tied_gradient(), then add_tied_gradient
// the other's on each side (float addition commutes: both copies end equal).
//
// The tensors forward and backward_input return come from this stage's pool
// and stay charged to its activation account until the receiving stage takes
// them (it re-charges them to its own). Micro-batch states and returned
// tensors must be destroyed before the stage.
//
// Thread safety: a stage is used by one thread at a time. Different stages
// may be used concurrently from different threads: they share nothing (BLAS
// runs on the calling thread, see gemm.h).
template <class T>
class BasicStage {
 public:
  using State = BasicMicrobatchState<T>;
  using Input = BasicStageInput<T>;

  // Parameters start at zero: init_parameters, copy_parameters_from or
  // load_parameters (model_file.h) fill them.
  BasicStage(const ModelConfig& config, LayerRange layers, StageOptions options = {});
  BasicStage(const BasicStage&) = delete;
  BasicStage& operator=(const BasicStage&) = delete;

  const ModelConfig& config() const { return config_; }
  LayerRange layers() const { return range_; }
  const StageOptions& options() const { return options_; }
  // What the training passes multiply in (StageOptions::bf16_gemm resolved).
  GemmPrecision gemm_precision() const { return gemm_precision_; }
  bool has_embedding() const { return range_.first == 0; }
  bool has_head() const { return range_.last == config_.pipeline_layers(); }
  // The positions of each sequence of t an activation between this stage's
  // layers (and sent to or from it) holds: t, or t/size under sequence parallelism.
  int positions_held(int t) const { return sequence_split() ? t / options_.tensor->size() : t; }

  // --- Parameters and gradients ---
  const ParameterLayout& layout() const { return layout_; }
  // The fp32 (master) parameters. Writing through the mutable accessors
  // marks a half-precision stage's rounded copy stale: the next pass
  // refreshes it.
  std::span<T> parameters() {
    require_matrices("parameters");
    compute_stale_ = true;
    return values_.span();
  }
  std::span<const T> parameters() const {
    require_matrices("parameters");
    return values_.span();
  }
  std::span<T> gradients() { return grads_.span(); }
  std::span<const T> gradients() const { return grads_.span(); }
  // One tensor by name (Error if this stage does not hold it).
  std::span<T> parameter(std::string_view name);
  std::span<const T> parameter(std::string_view name) const;
  std::span<T> gradient(std::string_view name);
  std::span<const T> gradient(std::string_view name) const;
  // The family's initialisation (init_parameters in parameter_layout.h): the same values
  // for a tensor whatever range holds it.
  void init_parameters(std::uint64_t seed);
  // Copies every tensor of this stage from `source` by name (e.g. from a whole
  // model); source must hold them all, whole or split as this stage holds them.
  void copy_parameters_from(const BasicStage& source);

  // --- One micro-batch ---
  // Returns the output activation [B, T, C] for the next stage, or an empty
  // tensor on the stage holding the head (the loss is in state.loss()).
  BasicTensor<T> forward(State& state, Input input);
  // I on a stage without the head: takes ∂L/∂output [B, T, C], returns
  // ∂L/∂input [B, T, C] (empty on the stage holding the embedding).
  BasicTensor<T> backward_input(State& state, BasicTensor<T> grad_output);
  // I on the stage holding the head: the gradient of loss_scale · loss.
  BasicTensor<T> backward_input_from_loss(State& state, double loss_scale);
  // W: adds this micro-batch's weight gradients and empties the state.
  void backward_weight(State& state);
  // B = I and W, layer by layer from the last: each layer's W runs right
  // after its I, so what it read is freed before the next layer's I (the
  // same gradients, bit for bit, as backward_input then backward_weight).
  BasicTensor<T> backward(State& state, BasicTensor<T> grad_output);
  BasicTensor<T> backward_from_loss(State& state, double loss_scale);

  // Inference on a stage holding the whole model: logits [B, T, V].
  BasicTensor<T> logits(const IntTensor& tokens);

  // --- Inference with a key/value cache (any range of layers) ---
  // A cache for this stage's blocks with room for `sequences` sequences of
  // the model's context, named after the stage.
  BasicKvCache<T> make_kv_cache(int sequences) const;
  // Runs the new rows of the sequences `rows` names through this stage's
  // layers, appending their keys and values to `cache` (and advancing its
  // lengths). Takes tokens [1, R] on the stage holding the embedding, else
  // the previous stage's activation [1, R, C]; returns the activation
  // [1, R, C] for the next stage or, on the stage holding the head, the
  // logits [n, V] of the last new row of each of the n sequences. Errors
  // name a sequence that would pass the context and a token outside the
  // vocabulary.
  BasicTensor<T> forward_cached(BasicKvCache<T>& cache, const SequenceRows& rows, Input input);
  // Rearranges every block's weight matrices into column panels in place
  // (tensor/panels.h), for forward_cached's products of a few rows: a decode
  // step multiplies each matrix by one row per sequence of a group, and the
  // panels are read once, in order, where sgemm would repack the matrix on
  // every call. The same bytes: no copy is kept beside them. A row's block
  // outputs do not depend on the other rows of its group (the head's logits
  // still go through sgemm). From then on the stage serves forward_cached
  // alone: forward (training), logits, init_parameters, copy_parameters_from and
  // reading or writing parameters are refused with an error.
  void pack_for_inference();
  bool packed_for_inference() const { return packed_; }

  // --- Between the last micro-batch and the optimizer step ---
  void zero_gradients();
  // Σ g² over this stage's gradients, in double, counting each model
  // parameter once across a pipeline: a head stage's copy of the tied
  // embedding is left out (the embedding stage counts it), and so are the
  // replicated tensors of a split stage on every tensor-parallel rank but
  // the first. Sum over stages (and tensor-parallel ranks), then √.
  // With [begin, end): the same over those elements of the flat gradient
  // (a data-parallel replica's part: each replica sums its own).
  double gradient_square_sum() const { return gradient_square_sum(0, layout_.total()); }
  double gradient_square_sum(std::int64_t begin, std::int64_t end) const;
  void scale_gradients(double factor);
  // Whether this stage's copy of the tied embedding (wte.weight,
  // model.embed_tokens.weight) must have its gradient summed with another
  // stage's copy (embedding and head on different stages).
  bool needs_tied_reduction() const { return config_.tied_embeddings && has_embedding() != has_head(); }
  std::span<T> tied_gradient() { return gradient(config_.embedding_name()); }
  void add_tied_gradient(std::span<const T> other);

  // --- Memory ---
  MemoryAccount& activation_memory() { return activation_memory_; }
  MemoryAccount& weight_memory() { return weight_memory_; }
  BufferPool& buffer_pool() { return pool_; }
  Allocator allocator() { return {&pool_, &activation_memory_}; }

 private:
  struct Flow {
    IntTensor tokens;
    BasicTensor<T> x;
  };
  enum class Kind { kEmbedding, kBlock, kHead };

  std::string where() const;
  Kind kind(int local) const;
  int block_index(int local) const;
  LayerShape check_input(const Input& input, bool with_targets) const;
  void check_tensor_sizes(std::initializer_list<std::pair<const char*, std::int64_t>> largest, std::string_view batch,
                          std::string_view fix) const;
  void check_tensor_sizes(const LayerShape& shape) const;
  void check_tokens(const IntTensor& tokens, const char* what, const LayerShape& shape) const;
  LayerShape check_cached_input(const BasicKvCache<T>& cache, const SequenceRows& rows, const Input& input) const;
  void require_phase(const State& state, typename State::Phase phase, const char* pass) const;
  // Fails, naming `what`, once pack_for_inference has run.
  void require_matrices(const char* what) const;
  // Fails, naming `what`, when the stage is split over a tensor-parallel group.
  void require_whole(const char* what) const;
  bool split() const { return options_.tensor != nullptr; }
  bool sequence_split() const { return split() && options_.sequence_parallel; }
  bool checkpointing() const { return options_.recompute_interval > 0; }
  bool half() const { return options_.format != ComputeFormat::kFp32; }

  // Where a layer reads its weights for a pass: `base` laid out by `layout`
  // (the stage's or the layer's own). `window` holds them when they were
  // widened for the pass; `bf16_matrices` hands the bf16 GEMMs the 16-bit
  // copy of the matrices the window leaves unwidened. Both must live while
  // the layer reads them.
  struct LayerWeights {
    const ParameterLayout* layout = nullptr;
    const T* base = nullptr;
    BasicTensor<T> window;
    Bf16Operands bf16_matrices;
    const T* at(std::string_view name) const { return base + layout->at(name).offset; }
  };
  // Points layer `local` at its weights and returns them: the parameters in
  // fp32; a half stage's widened copy once packed for inference; else the
  // layer's tensors widened from the 16-bit copy (refreshed first when the
  // master weights changed) into a window from the pool, exactly. In a pass
  // whose GEMMs are bf16 (current_gemm_precision), the matrices only GEMMs
  // read are not widened: the matmul takes their 16 bits as they are.
  LayerWeights layer_weights(int local);
  // The 16-bit copy from the master weights, when they changed since.
  void refresh_half_weights();
  // Points layer `local`'s weights at `base` laid out by `layout`.
  void point_layer(int local, const ParameterLayout& layout, const T* base);
  // Rounds an activation or its gradient to the stage's format.
  void round_to_format(BasicTensor<T>& tensor) const;

  // `stashed_after`: the layer's saved tensors are stashed right after
  // (a training forward without checkpointing), so a bf16-GEMM stage's
  // blocks round ahead (transformer_block.h, RoundAhead).
  Flow forward_layer(State& state, int local, Flow flow, bool stashed_after = false);
  // kYes where this stage's GEMMs are bf16 and the pass's layer is stashed
  // right after it.
  RoundAhead round_ahead(bool stashed_after) const;
  void checkpoint_layer(State& state, int local);
  // In bf16/fp16 a layer keeps what it saved in 16 bits between passes
  // (half_stash.h): stashed after F and after I, each tensor rounded once.
  // Before a fused backward's W (`weight_pass_follows`), what W reads other
  // than as a GEMM operand keeps its floats, rounded in place. Before I or
  // W, what the pass reads is widened, but where its GEMMs are bf16 what
  // only they read is handed to them in its bits through `stashed`, which
  // must live until the pass has run, and no longer.
  void stash_layer(State& state, int local, bool weight_pass_follows);
  void unstash_for_input(State& state, int local, Bf16Operands& stashed);
  void unstash_for_weight(State& state, int local, Bf16Operands& stashed);
  void weight_layer(State& state, int local);
  template <class F>
  void with_saved(State& state, int local, F&& f);
  // Empties the state after W, keeping the micro-batch's loss.
  void end_microbatch(State& state);
  void recompute_segment(State& state, int segment);
  // I from the output's gradient or from the loss (checked), then over the
  // layers; `weight_pass_follows` (a fused backward) runs each layer's W
  // right after its I instead of keeping (stashing) what W reads.
  BasicTensor<T> input_pass_from_output(State& state, BasicTensor<T> grad_output, bool weight_pass_follows);
  BasicTensor<T> input_pass_from_loss(State& state, double loss_scale, bool weight_pass_follows);
  BasicTensor<T> input_pass(State& state, BasicTensor<T> grad, double loss_scale, bool weight_pass_follows);

  ModelConfig config_;
  LayerRange range_;
  StageOptions options_;
  ParameterLayout layout_;
  MemoryAccount weight_memory_;
  MemoryAccount activation_memory_;
  BufferPool pool_;
  // The floats that stand for the 16-bit tensors W's bf16 GEMMs read as
  // their bits (HalfStash::lend): blocks nothing writes, so the system maps
  // no pages for them (but for small ones from the heap); they take address
  // space, not memory, and are charged to no account.
  BufferPool stand_in_pool_;
  BasicTensor<T> values_;
  BasicTensor<T> grads_;
  BasicTensor<T> rope_cos_, rope_sin_;  // Llama: [context, hs/2] (tensor/rope.h)
  // kBf16 / kFp16: the weights the layers multiply by, values_ rounded to
  // the format, in its 16 bits.
  BasicTensor<std::uint16_t> half_values_;
  bool compute_stale_ = true;
  GemmPrecision gemm_precision_ = GemmPrecision::kFp32;
  // kBf16 / kFp16, by local layer: the layer's own ParameterLayout (where its
  // window holds its tensors) and, per tensor, where it sits in the stage's
  // buffer and in the window, and whether only GEMMs read it (a block's or
  // the head's matrices; the embedding's are looked up).
  struct WindowTensor {
    std::int64_t stage_offset, window_offset, numel;
    bool gemm_only;
  };
  struct LayerWindow {
    ParameterLayout layout;
    std::vector<WindowTensor> tensors;
  };
  std::vector<LayerWindow> windows_;
  // A half stage packed for inference: every weight widened at once (its
  // panels are fp32), the layers pointed at it for good.
  BasicTensor<T> packed_values_;
  std::optional<EmbeddingLayer<T>> embedding_;
  std::vector<TransformerBlock<T>> blocks_;
  std::optional<LmHead<T>> head_;
  bool packed_ = false;  // pack_for_inference has run
};

using Stage = BasicStage<float>;
using MicrobatchState = BasicMicrobatchState<float>;
using StageInput = BasicStageInput<float>;

extern template class BasicStage<float>;
extern template class BasicStage<double>;

}  // namespace pipeflow::nn
