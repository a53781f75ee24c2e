#pragma once

#include <compare>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/model/model_spec.h"

namespace pipeflow {

// What the backward pass recomputes instead of keeping (Korthikanti et al.
// 2022): nothing; the attention core (QKᵀ, softmax, dropout, ·V) of every
// block; or each block's whole forward from its stored input.
enum class Recompute { kNone, kSelective, kFull };

std::string_view to_string(Recompute recompute);
// "none", "selective" or "full"; anything else is an Error listing them.
Recompute parse_recompute(std::string_view text);

// How one pipeline stage runs a micro-batch: the quantities below are per
// micro-batch and per device (one tensor-parallel rank).
struct ParallelConfig {
  int micro_batch = 1;             // b: sequences per micro-batch
  int seq_length = 0;                // s: tokens per sequence (1 .. max_positions for kGpt)
  int tensor_parallel = 1;         // t: Megatron tensor parallelism
  bool sequence_parallel = false;  // Megatron sequence parallelism (needs t > 1 to matter)
  Recompute recompute = Recompute::kNone;
  int bytes_per_element = 2;       // activations and messages: 2 for bf16/fp16, 4 for fp32
  // Megatron's scatter/gather of P2P messages across the t ranks (Narayanan
  // et al. 2021 §4.1): each rank sends 1/t of the message. Implied by
  // sequence parallelism, whose activations are already split.
  bool scatter_gather = false;

  friend auto operator<=>(const ParallelConfig&, const ParallelConfig&) = default;
};

enum class LayerKind { kEmbedding, kBlock, kHead, kPatchEmbedding, kVisionBlock, kProjector };
inline constexpr int kLayerKinds = 6;

// "embedding", "block", "head", "patch_embedding", "vision_block", "projector"
std::string_view to_string(LayerKind kind);

// Whether the layer is a transformer block (of the language model or of the
// vision tower): what recomputation repeats.
bool is_block(LayerKind kind);

// One pipeline layer: the unit a partition cuts between. A model of L blocks
// is L + 2 layers: "embedding", "block.0" … "block.{L-1}", "head" (final
// norm, LM head and loss), the same sequence as the model in `nn`. A
// vision-language model (ModelSpec::vision, L_v ViT blocks) puts
// "vision.patch_embedding", "vision.block.0" … "vision.block.{L_v-1}" and
// "projector" before them: L_v + L + 4 layers.
//
// FLOPs count matrix multiplications only, 2·m·n·k each, including the
// attention core's QKᵀ and (softmax)·V (2·b·s²·h each, heads·head_dim = h).
// Not counted: norms, softmax, activations, residual adds, rotary
// embeddings, the loss, the embedding gather and its gradient scatter — the
// convention of Narayanan et al. 2021 eq. 3, whose totals these sum to
// exactly. Per matmul the backward is dX (backward_input) and dW
// (backward_weight), each equal to the forward; the attention core has no
// weights, so its whole backward (dQ, dK from QKᵀ; d(probs), dV from ·V:
// twice its forward) is input-gradient work.
//
// Activation bytes are those held from this layer's forward until its
// backward, per micro-batch (see pipeline_layers.cc for the derivation):
//   block:     Korthikanti et al. 2022 eq. 1-6 for kGpt with dropout and
//              ffn = 4h, e.g. s·b·h·(34 + 5·a·s/h) bytes without TP; the same
//              accounting adapted to SwiGLU, GQA and no dropout for kLlama.
//   embedding: its dropout mask, s·b·h bytes (÷t with SP); 0 without dropout.
//              Token ids are not counted.
//   head:      the final norm's input and the LM head's input, e·s·b·h each
//              (÷t with SP), plus the fp32 logits the cross entropy keeps,
//              4·s·b·V/t (vocabulary-parallel) — Korthikanti's 4·s·b·h/t·(1 + V/h)
//              with SP and e = 2.
// The vision tower's layers (VisionSpec; k images per sequence, n_p patches
// of P²·C pixels each, n = n_p + 1 tokens with CLS, width h_v, n_i image
// tokens reaching the LM, H the LM's width):
//   patch_embedding: P²·C·h_v + h_v (CLS) + n·h_v (positions) + 2·h_v
//              (pre-LayerNorm) parameters, replicated over t; forward and W
//              2·b·k·n_p·P²·C·h_v each, I nothing (no gradient reaches the
//              pixels); keeps the pixels (the convolution's input) and the
//              pre-LayerNorm's input, e·b·k·(n_p·P²·C + n·h_v).
//   vision_block: a GPT block without dropout (block.N above) of width h_v,
//              heads a_v, ffn f_v over b·k sequences of n tokens
//              (vision_block_model, vision_block_config).
//   projector: h_v·H + H + H·H + H parameters (fc1 column-, fc2
//              row-parallel); forward, I and W 2·T·(h_v·H + H·H)/t each over
//              T = b·k·n_i tokens; keeps fc1's input and GELU's input and
//              output, e·T·(h_v/sp + 2H/t). Its output, e·T·H, is what
//              crosses to the LM's embedding, which splices it among the
//              text tokens.
struct PipelineLayer {
  std::string name;
  LayerKind kind = LayerKind::kBlock;
  // Parameters this layer owns, on one device (split matrices ÷t, rounded up
  // to the largest shard; norms, row-parallel biases and the position table
  // replicated).
  std::int64_t parameters = 0;
  // Parameters of a weight owned by another layer that this layer also uses:
  // the head's copy of the tied token embedding. A stage that holds this
  // layer but not the owner holds a copy (DeepSpeed's TiedLayerSpec).
  std::int64_t tied_parameters = 0;
  int tied_owner = -1;  // index of the owning layer, or -1
  double forward_flops = 0;
  double backward_input_flops = 0;   // I: gradients with respect to inputs
  double backward_weight_flops = 0;  // W: gradients with respect to weights
  // Extra forward work the backward does under the recompute mode: the
  // attention core for selective, the whole block forward for full. The
  // embedding and the head are never recomputed (Narayanan eq. 3 likewise).
  double recompute_flops = 0;
  double activation_bytes = 0;
  // Bytes of the tensor this layer hands to the next, which crosses to the
  // next stage if a cut follows it (and, as its gradient, comes back in
  // backward): e·b·s·h, ÷t with scatter/gather or SP; 0 for the head.
  double output_bytes = 0;
  // What trains (apply_training in training.h; pipeline_layers trains
  // everything): parameters with gradients and optimizer state, the tied
  // copy trained with its layer unless the layer is frozen.
  std::int64_t trainable_parameters = 0;
  bool frozen = false;    // the base weights get no gradient: no W for them
  bool backward = true;   // false: no backward at all (a frozen prefix)
  // LoRA: the adapters' forward FLOPs, part of forward_flops; I and W do as
  // much again each.
  double adapter_flops = 0;
};

// The L + 2 pipeline layers of `spec` run with `config`. Throws Error when
// the spec is invalid or the config does not fit it (sequence beyond the
// position table, t not dividing the heads, ...).
std::vector<PipelineLayer> pipeline_layers(const ModelSpec& spec, const ParallelConfig& config);

// The activation bytes one block keeps per micro-batch from its forward to
// its backward under `config` (its recompute mode; Korthikanti et al. 2022).
double block_activation_bytes(const ModelSpec& spec, const ParallelConfig& config);

// The model and configuration a vision block is counted with: a GPT block
// of the tower's width, heads and ffn, without dropout, its micro-batch the
// b·images images of vision_tokens tokens each. `spec` must have a vision tower.
ModelSpec vision_block_model(const ModelSpec& spec);
ParallelConfig vision_block_config(const ModelSpec& spec, const ParallelConfig& config);

// The number of pipeline layers of `spec`: L + 2, and L_v + 2 more with a
// vision tower.
int pipeline_layer_count(const ModelSpec& spec);

// Tokens of the language model's sequence that are image tokens:
// images · image_tokens per sequence; 0 without a vision tower.
int image_tokens_per_sequence(const ModelSpec& spec);

// Sums over layers [first, end).
struct LayerTotals {
  std::int64_t parameters = 0;  // including tied copies whose owner is outside the range
  std::int64_t trainable_parameters = 0;  // likewise, of those that train
  double forward_flops = 0;
  double backward_input_flops = 0;
  double backward_weight_flops = 0;
  double recompute_flops = 0;
  double activation_bytes = 0;

  // Model FLOPs (what MFU counts): forward + both backward halves.
  double model_flops() const { return forward_flops + backward_input_flops + backward_weight_flops; }
  // Hardware FLOPs (HFU): model FLOPs plus recomputation.
  double hardware_flops() const { return model_flops() + recompute_flops; }
};

LayerTotals sum_layers(const std::vector<PipelineLayer>& layers, int first, int end);
inline LayerTotals sum_layers(const std::vector<PipelineLayer>& layers) {
  return sum_layers(layers, 0, static_cast<int>(layers.size()));
}

}  // namespace pipeflow
