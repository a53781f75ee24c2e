#include "pipeflow/sim/cost_model.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>

#include "pipeflow/core/error.h"
#include "pipeflow/model/model_states.h"
#include "pipeflow/schedule/generators.h"

namespace pipeflow {
namespace {

// Index of the first device of pipeline rank r (tp rank 0, dp rank 0).
int first_device(const Layout& layout, RankId rank) {
  const int stride = layout.rank_order == RankOrder::kTensorPipelineData
                         ? layout.tensor_parallel
                         : layout.tensor_parallel * layout.data_parallel;
  return rank.value() * stride;
}

// Devices between neighbouring replicas of the same rank.
int data_parallel_stride(const Layout& layout) {
  return layout.rank_order == RankOrder::kTensorPipelineData ? layout.tensor_parallel * layout.pipeline_ranks
                                                             : layout.tensor_parallel;
}

// The seconds of one layer of each kind, priced once per stage.
struct KindSeconds {
  LayerSeconds compute;
  TensorParallelSeconds tensor;
  double weight_gradient_bytes = 0;
};

// The activations a stage holds per micro-batch. With full recomputation
// every k-th layer of the stage keeps its input (nn::Stage's segments, from
// its first layer): the blocks between keep nothing until the backward
// rebuilds their segment, k blocks' whole activations at once.
struct StageActivations {
  double held = 0;
  double recompute_working = 0;  // above `held`, while a backward rebuilds a segment
};

StageActivations stage_activations(const Layout& layout, const std::vector<PipelineLayer>& layers,
                                   const StagePlan& plan) {
  StageActivations out;
  const int k = layout.recompute == Recompute::kFull ? layout.recompute_interval : 1;
  int blocks = 0;
  bool text_blocks = false, vision_blocks = false;  // which kinds of block the backward rebuilds
  for (int i = plan.first; i < plan.end; ++i) {
    const PipelineLayer& layer = layers[static_cast<std::size_t>(i)];
    const bool kept = !is_block(layer.kind) || (i - plan.first) % k == 0;
    if (kept) out.held += layer.activation_bytes;
    if (!is_block(layer.kind) || !layer.backward) continue;
    ++blocks;
    (layer.kind == LayerKind::kBlock ? text_blocks : vision_blocks) = true;
  }
  if (layout.recompute != Recompute::kFull || blocks == 0) return out;
  // A segment rebuilds k blocks' whole activations, the widest kind's.
  ParallelConfig whole = parallel_config(layout);
  whole.recompute = Recompute::kNone;
  double widest_block = 0;
  if (text_blocks) widest_block = block_activation_bytes(layout.model, whole);
  if (vision_blocks) {
    widest_block = std::max(widest_block, block_activation_bytes(vision_block_model(layout.model),
                                                                 vision_block_config(layout.model, whole)));
  }
  out.recompute_working = std::min(k, blocks) * widest_block;
  return out;
}

StageCosts price_stage(const Layout& layout, const std::vector<PipelineLayer>& layers, const StagePlan& plan,
                       const LinkCost& tensor_link, const LinkCost& data_parallel_link) {
  const ModelSpec& model = layout.model;
  const ParallelConfig config = parallel_config(layout);
  const HardwareProfile hw = priced_hardware(layout);

  StageCosts stage;
  std::array<std::optional<KindSeconds>, kLayerKinds> kinds;
  double recompute_s = 0;
  for (int i = plan.first; i < plan.end; ++i) {
    const PipelineLayer& layer = layers[static_cast<std::size_t>(i)];
    std::optional<KindSeconds>& priced = kinds[static_cast<std::size_t>(layer.kind)];
    if (!priced) {
      priced = KindSeconds{layer_compute_seconds(model, config, layer.kind, hw),
                           tensor_parallel_seconds(model, config, layer.kind, tensor_link),
                           weight_gradient_bytes(model, config, layer.kind)};
    }
    // LoRA's adapters: thin GEMMs at the achieved rate, as much in I and W
    // as in the forward (and again in a full recompute).
    const double adapter_s = compute_seconds(layer.adapter_flops, hw);
    // Synchronous launches: the host's time per block pass (layout.h).
    const double launch_s = is_block(layer.kind) ? layout.block_launch_overhead_s : 0;
    const bool full = config.recompute == Recompute::kFull;
    stage.forward_s += priced->compute.forward_s + priced->tensor.forward_s + adapter_s + launch_s;
    // A frozen layer has no W for its base weights; a frozen prefix no backward.
    if (!layer.backward) continue;
    stage.backward_input_s +=
        priced->compute.backward_input_s + priced->tensor.backward_input_s + adapter_s + launch_s;
    recompute_s += priced->compute.recompute_s + (full ? adapter_s + launch_s : 0);
    stage.backward_weight_s += (layer.frozen ? 0 : priced->compute.backward_weight_s + launch_s) + adapter_s;
    if (!layer.frozen) stage.weight_gradient_bytes += priced->weight_gradient_bytes;
  }
  stage.backward_input_s += recompute_s;
  // ZeRO-3: every F and every backward first all-gathers the stage's
  // parameters from the replicas (in the compute format), as DeepSpeed's
  // stage 3 does for each micro-batch, and the gradients are reduce-scattered,
  // not all-reduced (gradient_bytes below): 1.5x plain data parallelism's
  // traffic at one micro-batch (Rajbhandari et al. 2020, §7.2.2).
  const bool zero3 = layout.zero == ZeroStage::kThree && layout.data_parallel > 1;
  if (zero3) {
    const double gather = ring_all_gather_seconds(
        static_cast<double>(config.bytes_per_element) * static_cast<double>(plan.parameters), layout.data_parallel,
        data_parallel_link);
    stage.forward_s += gather;
    const bool backward = std::any_of(layers.begin() + plan.first, layers.begin() + plan.end,
                                      [](const PipelineLayer& layer) { return layer.backward; });
    if (backward) stage.backward_input_s += gather;
  }
  stage.backward_s = stage.backward_input_s + stage.backward_weight_s;
  stage.output_bytes = layers[static_cast<std::size_t>(plan.end - 1)].output_bytes;

  // Only trainable parameters have gradients, optimizer states and a
  // data-parallel reduction; a frozen one holds its weight alone.
  const std::int64_t parameters = plan.trainable_parameters;
  const StateAccounting accounting = state_accounting(layout.precision, layout.gradient_accumulation);
  const ZeroStage frozen_zero = layout.zero == ZeroStage::kThree ? ZeroStage::kThree : ZeroStage::kNone;
  stage.model_state_bytes =
      model_state_bytes(parameters, layout.zero, layout.data_parallel, accounting).total() +
      model_state_bytes(plan.parameters - parameters, frozen_zero, layout.data_parallel, accounting).weights;
  const StageActivations activations = stage_activations(layout, layers, plan);
  stage.activation_bytes = activations.held;
  stage.backward_working_bytes = activations.recompute_working;
  stage.gradient_bytes = bytes_per_element(layout.gradient_precision) * static_cast<double>(parameters) *
                         (zero3 ? 0.5 : 1);
  const double local = layout.zero == ZeroStage::kNone
                           ? static_cast<double>(parameters)
                           : static_cast<double>(parameters) / layout.data_parallel;
  stage.optimizer_s = memory_seconds(hw, kOptimizerBytesPerParameter * local);
  return stage;
}

// One send and one receive buffer for each message a stage exchanges: its
// input and its output, each in both directions (activation and gradient).
void add_comm_buffers(std::vector<StageCosts>& stages) {
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const double input = s == 0 ? 0 : stages[s - 1].output_bytes;
    const double output = s + 1 == stages.size() ? 0 : stages[s].output_bytes;
    stages[s].comm_buffer_bytes = 2 * (input + output);
  }
}

LinkTable pipeline_links(const Layout& layout, const Schedule& schedule) {
  LinkTable links;
  for (int s = 0; s + 1 < schedule.num_stages(); ++s) {
    const RankId a = schedule.rank_of(StageId(s));
    const RankId b = schedule.rank_of(StageId(s + 1));
    if (a == b) continue;
    const LinkCost link = link_cost(link_between(layout.hardware, first_device(layout, a), first_device(layout, b)));
    links.set(a, b, link);
    links.set(b, a, link);
  }
  return links;
}

// The data-parallel group of rank r spans devices first .. first + (d − 1)·s,
// s the replicas' stride; a ring over it runs at the slowest link it crosses.
std::vector<LinkCost> data_parallel_links(const Layout& layout, int ranks) {
  std::vector<LinkCost> links;
  for (int r = 0; r < ranks; ++r) {
    const int first = first_device(layout, RankId(r));
    const int last = first + (layout.data_parallel - 1) * data_parallel_stride(layout);
    links.push_back(collective_link_cost(link_between(layout.hardware, first, last), layout.hardware));
  }
  return links;
}

}  // namespace

double weight_gradient_bytes(const ModelSpec& model, const ParallelConfig& config, LayerKind kind) {
  const double t = config.tensor_parallel;
  const double sp = config.sequence_parallel ? t : 1;
  const double ebs = static_cast<double>(config.bytes_per_element) * config.micro_batch * config.seq_length;
  const double h = model.hidden;
  const double f = model.ffn;
  switch (kind) {
    case LayerKind::kEmbedding:
      return ebs * h / sp;
    case LayerKind::kHead:
      return ebs * (h / sp + static_cast<double>(model.vocab) / t);
    case LayerKind::kBlock:
      if (model.architecture == Architecture::kGpt) return ebs * (4 * h / sp + (4 * h + 2 * f) / t);
      return ebs * (4 * h / sp + (2 * h + kv_width(model) + 3 * f) / t);
    case LayerKind::kVisionBlock:
      return weight_gradient_bytes(vision_block_model(model), vision_block_config(model, config), LayerKind::kBlock);
    case LayerKind::kPatchEmbedding: {
      const VisionSpec& v = *model.vision;
      const double patches = static_cast<double>(config.micro_batch) * v.images * patch_tokens(v);
      return config.bytes_per_element * patches * (static_cast<double>(v.patch_size) * v.patch_size * v.channels +
                                                   v.hidden);
    }
    case LayerKind::kProjector: {
      const double tokens = static_cast<double>(config.micro_batch) * image_tokens_per_sequence(model);
      return config.bytes_per_element * tokens * (model.vision->hidden / sp + 2 * h / t + h / sp);
    }
  }
  return 0;
}

TensorParallelSeconds tensor_parallel_seconds(const ModelSpec& model, const ParallelConfig& config, LayerKind kind,
                                              const LinkCost& link) {
  const int t = config.tensor_parallel;
  if (t <= 1) return {};
  const double activation = static_cast<double>(config.bytes_per_element) * config.micro_batch * config.seq_length *
                            model.hidden;
  const double all_reduce = ring_all_reduce_seconds(activation, t, link);
  switch (kind) {
    case LayerKind::kEmbedding:
      return {all_reduce, 0};
    case LayerKind::kHead:
      return {0, all_reduce};
    case LayerKind::kBlock: {
      const double recompute = config.recompute == Recompute::kFull ? 2 * all_reduce : 0;
      return {2 * all_reduce, 2 * all_reduce + recompute};
    }
    case LayerKind::kVisionBlock:
      return tensor_parallel_seconds(vision_block_model(model), vision_block_config(model, config),
                                     LayerKind::kBlock, link);
    case LayerKind::kPatchEmbedding:
      return {};  // replicated
    case LayerKind::kProjector: {
      // fc2's (row-parallel) output in the forward, fc1's (column-parallel)
      // input gradient in I.
      const double tokens = static_cast<double>(config.bytes_per_element) * config.micro_batch *
                            image_tokens_per_sequence(model);
      return {ring_all_reduce_seconds(tokens * model.hidden, t, link),
              ring_all_reduce_seconds(tokens * model.vision->hidden, t, link)};
    }
  }
  return {};
}

LinkCost link_cost(const Link& link) { return LinkCost{link.latency_s, link.bandwidth_bytes_per_s}; }

LinkCost collective_link_cost(const Link& link, const HardwareProfile& hardware) {
  return LinkCost{link.latency_s, link.bandwidth_bytes_per_s * hardware.collective_efficiency};
}

namespace {

// A GEMM of one layer, per micro-batch and device: m×k by k×n, `count` of them.
struct Gemm {
  double m, n, k, count = 1;
};

double gemms_seconds(const HardwareProfile& hw, std::initializer_list<Gemm> gemms) {
  double seconds = 0;
  for (const Gemm& g : gemms) seconds += matmul_seconds(hw, g.m, g.n, g.k, g.count);
  return seconds;
}

// The block's memory-bound kernels, bytes per micro-batch and device, as
// Megatron-LM fuses them (apex LayerNorm, bias-GELU / SwiGLU, bias-dropout-
// add, scale-mask-softmax; attention unfused, as in the published runs). Per
// element of a tensor of e bytes, a dropout mask 1 byte:
//   forward   LayerNorm ×2: read, write (2e); bias-dropout-add ×2: read the
//             branch and the residual, write, mask (3e + drop); activation
//             on the f/t-wide MLP: read, write (2e; SwiGLU reads gate and
//             up: 3e); softmax on b·(a/t)·s² scores: read, write (2e), its
//             dropout read, write, mask (2e + 1)
//   backward  LayerNorm: read input and gradient, write (3e); dropout-add:
//             read gradient and mask, write (2e + drop); activation: read
//             input and gradient, write (3e; SwiGLU 5e); softmax: read
//             probabilities and gradient, write (3e); its dropout (2e + 1)
// Tensors of width h are whole on every tensor-parallel rank without
// sequence parallelism (÷t with it); the MLP's and the scores are ÷t.
struct BlockMemoryBytes {
  double forward = 0;         // everything but the attention core
  double core_forward = 0;    // softmax and its dropout
  double backward = 0;        // everything but the attention core
  double core_backward = 0;
};

BlockMemoryBytes block_memory_bytes(const ModelSpec& model, const ParallelConfig& c) {
  const double e = c.bytes_per_element;
  const double drop = model.dropout ? 1 : 0;
  const double t = c.tensor_parallel;
  const double sp = c.sequence_parallel ? t : 1;
  const double tokens = static_cast<double>(c.micro_batch) * c.seq_length;
  const double wide = tokens * model.hidden / sp;
  const double mlp = tokens * model.ffn / t;
  const double scores = c.micro_batch * (model.heads / t) * static_cast<double>(c.seq_length) * c.seq_length;
  const bool gpt = model.architecture == Architecture::kGpt;
  BlockMemoryBytes bytes;
  bytes.forward = 2 * (2 * e) * wide + 2 * (3 * e + drop) * wide + (gpt ? 2 * e : 3 * e) * mlp;
  bytes.backward = 2 * (3 * e) * wide + 2 * (2 * e + drop) * wide + (gpt ? 3 * e : 5 * e) * mlp;
  bytes.core_forward = (2 * e + drop * (2 * e + 1)) * scores;
  bytes.core_backward = (3 * e + drop * (2 * e + 1)) * scores;
  return bytes;
}

// The block's forward GEMMs per micro-batch and device: the four linear
// layers, and the attention core (QKᵀ, s×d by d×s, and probs·V, s×s by s×d,
// per head). A backward half (dX: m×n by n×k, dW: k×m by m×n) has the same
// FLOPs and the same size x, hence the same seconds.
struct BlockGemmSeconds {
  double linear = 0;
  double core = 0;
};

// The block's four weight GEMMs over `tokens` rows (QKV, projection, up,
// down), each split t ways.
double block_linear_seconds(const ModelSpec& model, double tokens, double t, const HardwareProfile& hw) {
  const double h = model.hidden;
  const double f = model.ffn;
  const bool gpt = model.architecture == Architecture::kGpt;
  const double qkv = gpt ? 3 * h : h + kv_width(model);
  const double up = gpt ? f : 2 * f;
  return gemms_seconds(hw, {{tokens, qkv / t, h}, {tokens, h, h / t}, {tokens, up / t, h}, {tokens, h, f / t}});
}

// The attention core of `count` sequences' `rows` queries each against
// `keys` positions: scores q·kᵀ and their product with v, per head.
double attention_core_seconds(const ModelSpec& model, double rows, double keys, double count, double t,
                              const HardwareProfile& hw) {
  const double head_width = static_cast<double>(model.hidden) / model.heads;
  const double heads = count * model.heads / t;
  return gemms_seconds(hw, {{rows, keys, head_width, heads}, {rows, head_width, keys, heads}});
}

BlockGemmSeconds block_gemm_seconds(const ModelSpec& model, const ParallelConfig& c, const HardwareProfile& hw) {
  const double t = c.tensor_parallel;
  const double s = c.seq_length;
  return {block_linear_seconds(model, static_cast<double>(c.micro_batch) * s, t, hw),
          attention_core_seconds(model, s, s, c.micro_batch, t, hw)};
}

LayerSeconds block_seconds(const ModelSpec& model, const ParallelConfig& c, const HardwareProfile& hw) {
  const auto [linear, core] = block_gemm_seconds(model, c, hw);
  const BlockMemoryBytes bytes = block_memory_bytes(model, c);
  const double core_forward = core + memory_seconds(hw, bytes.core_forward);
  LayerSeconds out;
  out.forward_s = linear + core_forward + memory_seconds(hw, bytes.forward);
  out.backward_input_s = linear + 2 * core + memory_seconds(hw, bytes.backward + bytes.core_backward);
  out.backward_weight_s = linear;
  out.recompute_s = c.recompute == Recompute::kFull        ? out.forward_s
                    : c.recompute == Recompute::kSelective ? core_forward
                                                           : 0;
  return out;
}

}  // namespace

LayerSeconds layer_compute_seconds(const ModelSpec& model, const ParallelConfig& c, LayerKind kind,
                                   const HardwareProfile& hw) {
  const double e = c.bytes_per_element;
  const double t = c.tensor_parallel;
  const double sp = c.sequence_parallel ? t : 1;
  const double tokens = static_cast<double>(c.micro_batch) * c.seq_length;
  const double wide = tokens * model.hidden / sp;
  switch (kind) {
    case LayerKind::kBlock:
      return block_seconds(model, c, hw);
    case LayerKind::kVisionBlock:
      return block_seconds(vision_block_model(model), vision_block_config(model, c), hw);
    case LayerKind::kPatchEmbedding: {
      // The convolution as one GEMM (patches × P²·C by P²·C × h_v, whole on
      // every rank); the position add (read 2e, write e) and the
      // pre-LayerNorm (2e) over the tokens. No gradient reaches the pixels:
      // W carries the LayerNorm's backward (3e) and the convolution's dW.
      const VisionSpec& v = *model.vision;
      const double images = static_cast<double>(c.micro_batch) * v.images;
      const double patches = images * patch_tokens(v);
      const double vision_wide = images * vision_tokens(v) * v.hidden;
      const double gemm = matmul_seconds(
          hw, patches, v.hidden, static_cast<double>(v.patch_size) * v.patch_size * v.channels);
      LayerSeconds out;
      out.forward_s = gemm + memory_seconds(hw, 5 * e * vision_wide);
      out.backward_weight_s = gemm + memory_seconds(hw, 3 * e * vision_wide);
      return out;
    }
    case LayerKind::kProjector: {
      // fc1 (T × H/t by h_v), GELU on T·H/t (2e forward, 3e backward), fc2
      // (T × H by H/t), over the T image tokens.
      const double image = static_cast<double>(c.micro_batch) * image_tokens_per_sequence(model);
      const double h = model.hidden;
      const double gemms = gemms_seconds(hw, {{image, h / t, static_cast<double>(model.vision->hidden)},
                                              {image, h, h / t}});
      LayerSeconds out;
      out.forward_s = gemms + memory_seconds(hw, 2 * e * image * h / t);
      out.backward_input_s = gemms + memory_seconds(hw, 3 * e * image * h / t);
      out.backward_weight_s = gemms;
      return out;
    }
    case LayerKind::kEmbedding: {
      // Gather: read the rows, write the output (2e); backward: scatter-add
      // the gradient into the fp32 table gradient (read e, read and write 4 + 4).
      LayerSeconds out;
      out.forward_s = memory_seconds(hw, 2 * e * wide);
      out.backward_weight_s = memory_seconds(hw, (e + 8) * wide);
      return out;
    }
    case LayerKind::kHead: {
      // The final norm (2e forward, 3e backward per element of width h); the
      // LM head's GEMM (m = tokens, n = V/t, k = h); the vocabulary-parallel
      // cross entropy over b·s·V/t logits: forward reads them (e), writes the
      // fp32 copy (4), reads it for the max and the sum of exponentials (4),
      // writes the softmax it keeps (4); backward reads that (4) and writes
      // the logits' gradient (e).
      const double logits = tokens * static_cast<double>(model.vocab) / t;
      const double gemm = matmul_seconds(hw, tokens, static_cast<double>(model.vocab) / t, model.hidden);
      LayerSeconds out;
      out.forward_s = gemm + memory_seconds(hw, 2 * e * wide + (e + 12) * logits);
      out.backward_input_s = gemm + memory_seconds(hw, 3 * e * wide + (4 + e) * logits);
      out.backward_weight_s = gemm;
      return out;
    }
  }
  return {};
}

double layer_prefill_seconds(const ModelSpec& model, std::span<const PrefillPiece> chunk, int bytes_per_element,
                             LayerKind kind, const HardwareProfile& hw) {
  const double e = bytes_per_element;
  double tokens = 0;
  double finished = 0;  // rows that reach the LM head
  for (const PrefillPiece& piece : chunk) {
    tokens += static_cast<double>(piece.rows * piece.count);
    if (piece.ends_prompt) finished += static_cast<double>(piece.count);
  }
  // Memory-bound kernels move bytes in proportion to the tokens: one token's, scaled.
  ParallelConfig one_token;
  one_token.micro_batch = 1;
  one_token.seq_length = 1;
  one_token.bytes_per_element = bytes_per_element;
  switch (kind) {
    case LayerKind::kBlock: {
      double seconds = block_linear_seconds(model, tokens, 1, hw) +
                       memory_seconds(hw, tokens * block_memory_bytes(model, one_token).forward);
      for (const PrefillPiece& piece : chunk) {
        seconds += attention_core_seconds(model, static_cast<double>(piece.rows),
                                          static_cast<double>(piece.cached + piece.rows),
                                          static_cast<double>(piece.count), 1, hw);
      }
      return seconds;
    }
    case LayerKind::kEmbedding:
      return tokens * layer_compute_seconds(model, one_token, kind, hw).forward_s;
    case LayerKind::kHead:
      if (finished == 0) return 0;
      return matmul_seconds(hw, finished, static_cast<double>(model.vocab), model.hidden) +
             memory_seconds(hw, 2 * e * finished * model.hidden + e * finished * static_cast<double>(model.vocab));
    case LayerKind::kPatchEmbedding:
    case LayerKind::kVisionBlock:
    case LayerKind::kProjector:
      break;  // resolve_inference_setup refuses vision models
  }
  fail("internal: {} layers have no inference price", to_string(kind));
}

DecodeWork layer_decode_work(const ModelSpec& model, const PipelineLayer& layer, int sequences,
                             std::int64_t cached, int bytes_per_element) {
  const double n = sequences;
  const double e = bytes_per_element;
  const double weights = static_cast<double>(layer.parameters + layer.tied_parameters);
  switch (layer.kind) {
    case LayerKind::kEmbedding:
      return {e * n * model.hidden, 0};
    case LayerKind::kHead:
      return {e * weights, 2 * n * weights};
    case LayerKind::kBlock: {
      const double kv = static_cast<double>(
          kv_cache_bytes(1, model.kv_heads, model.hidden / model.heads, bytes_per_element, cached, sequences));
      return {e * weights + kv, 2 * n * weights + 4 * n * static_cast<double>(cached) * model.hidden};
    }
    case LayerKind::kPatchEmbedding:
    case LayerKind::kVisionBlock:
    case LayerKind::kProjector:
      break;  // resolve_inference_setup refuses vision models
  }
  fail("internal: {} layers have no inference price", to_string(layer.kind));
}

double decode_seconds(const DecodeWork& work, const HardwareProfile& hw) {
  return std::max(memory_seconds(hw, work.bytes), compute_seconds(work.flops, hw));
}

Schedule layout_schedule(const Layout& layout) {
  if (layout.file_schedule) return *layout.file_schedule;
  return make_schedule(layout.schedule, layout.pipeline_ranks, microbatches_per_step(layout),
                       layout.chunks);
}

namespace {

// The layout's pipeline layers, after checking that the layout, its
// hardware and the schedule agree and that every stage gets a layer.
std::vector<PipelineLayer> checked_layers(const Layout& layout, const Schedule& schedule) {
  validate_layout(layout);
  validate_hardware(layout.hardware);
  if (schedule.num_ranks() != layout.pipeline_ranks) {
    fail("internal: schedule {} has {} ranks but the layout {} pipeline stages", schedule.name(),
         schedule.num_ranks(), layout.pipeline_ranks);
  }
  std::vector<PipelineLayer> layers = layout_layers(layout);
  if (schedule.num_stages() > static_cast<int>(layers.size())) {
    const std::string stages = schedule.chunks_per_rank() == 1
                                   ? fmt::format("{} stages", schedule.num_stages())
                                   : fmt::format("{} ranks × {} chunks = {} stages", schedule.num_ranks(),
                                                 schedule.chunks_per_rank(), schedule.num_stages());
    fail("{} for {}'s {} pipeline layers (embedding, {} blocks, head): every stage needs a layer; use fewer "
         "pipeline stages or virtual stages",
         stages, layout.model.name, layers.size(), layout.model.layers);
  }
  return layers;
}

// Micro-batches that differ (variable_seq_lengths, variable_images): each
// priced at its own shape on the layout's cut, each shape once; the model
// FLOPs and tokens of a step summed over the micro-batches.
void price_microbatch_shapes(const Layout& layout, const Schedule& schedule, const LinkCost& tensor_link,
                             LayoutCosts& out) {
  struct Priced {
    std::vector<StageCosts> stages;
    LayerTotals totals;
  };
  std::map<MicrobatchShape, Priced> by_shape;
  const double replicas = layout.data_parallel;
  out.model_flops_per_step = out.hardware_flops_per_step = out.tokens_per_step = 0;
  for (const MicrobatchShape& shape : microbatch_shapes(layout, schedule.num_microbatches())) {
    auto [at, added] = by_shape.try_emplace(shape);
    if (added) {
      const Layout own = with_microbatch_shape(layout, shape);
      const std::vector<PipelineLayer> layers = layout_layers(own);
      for (std::size_t s = 0; s < out.partition.stages.size(); ++s) {
        const RankId rank = schedule.rank_of(StageId(static_cast<int>(s)));
        at->second.stages.push_back(price_stage(own, layers, out.partition.stages[s], tensor_link,
                                                out.costs.data_parallel_links[static_cast<std::size_t>(rank.value())]));
      }
      at->second.totals = sum_layers(layout_layers(own, whole_model_config(own)));
    }
    out.costs.microbatch_stages.push_back(at->second.stages);
    out.model_flops_per_step += at->second.totals.model_flops() * replicas;
    out.hardware_flops_per_step += at->second.totals.hardware_flops() * replicas;
    out.tokens_per_step += static_cast<double>(layout.micro_batch) * shape.seq_length * replicas;
  }
}

}  // namespace

Partition layout_partition(const Layout& layout, const Schedule& schedule) {
  return partition_layers(checked_layers(layout, schedule), schedule.num_stages(), layout.partition,
                          priced_hardware(layout));
}

LayoutCosts layout_costs(const Layout& layout, const Schedule& schedule) {
  return layout_costs(layout, schedule, layout_partition(layout, schedule));
}

LayoutCosts layout_costs(const Layout& layout, const Schedule& schedule, Partition partition) {
  const std::vector<PipelineLayer> layers = checked_layers(layout, schedule);
  if (static_cast<int>(partition.stages.size()) != schedule.num_stages()) {
    fail("internal: a partition of {} stages for schedule {}'s {}", partition.stages.size(), schedule.name(),
         schedule.num_stages());
  }
  const ParallelConfig config = parallel_config(layout);
  LayoutCosts out;
  out.partition = std::move(partition);

  const LinkCost tensor_link =
      collective_link_cost(link_between(layout.hardware, 0, layout.tensor_parallel - 1), layout.hardware);
  out.costs.data_parallel = layout.data_parallel;
  out.costs.data_parallel_links = data_parallel_links(layout, schedule.num_ranks());
  for (std::size_t s = 0; s < out.partition.stages.size(); ++s) {
    const RankId rank = schedule.rank_of(StageId(static_cast<int>(s)));
    out.costs.stages.push_back(price_stage(layout, layers, out.partition.stages[s], tensor_link,
                                           out.costs.data_parallel_links[static_cast<std::size_t>(rank.value())]));
  }
  add_comm_buffers(out.costs.stages);
  out.costs.links = pipeline_links(layout, schedule);
  out.costs.comm_mode = layout.comm_mode;

  // Whole-model FLOPs: the layers without tensor parallelism, once per
  // micro-batch of every replica (B / b of them).
  const LayerTotals totals = sum_layers(layout_layers(layout, whole_model_config(layout)));
  const double microbatches = static_cast<double>(layout.global_batch) / layout.micro_batch;
  out.model_flops_per_step = totals.model_flops() * microbatches;
  out.hardware_flops_per_step = totals.hardware_flops() * microbatches;
  out.tokens_per_step = static_cast<double>(layout.global_batch) * config.seq_length;
  if (microbatches_differ(layout)) price_microbatch_shapes(layout, schedule, tensor_link, out);
  return out;
}

}  // namespace pipeflow
