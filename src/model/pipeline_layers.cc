#include "pipeflow/model/pipeline_layers.h"

#include <fmt/format.h>

#include <limits>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

// Dimension letters: b micro-batch, s sequence, h hidden, a heads, g kv heads,
// d = h/a head width, f ffn width, V vocabulary, t tensor parallel, e bytes per
// activation element. Totals are computed for the whole layer and divided by t
// (every matmul, and the attention heads, are split t ways).

std::int64_t shard(std::int64_t dimension, int t) { return (dimension + t - 1) / t; }

// Weights of the block's matrices, i.e. multiply-adds per token of its linear layers.
//   gpt:   QKV h·3h, out h·h, fc1 h·f, fc2 f·h            = 4h² + 2hf (12h² for f = 4h)
//   llama: Q h·h, K and V h·gd each, O h·h, gate/up h·f, down f·h = 2h² + 2h·gd + 3hf
double block_matrix_weights(const ModelSpec& m) {
  const double h = m.hidden;
  const double f = m.ffn;
  if (m.architecture == Architecture::kGpt) return 4 * h * h + 2 * h * f;
  return 2 * h * h + h * kv_width(m) + 3 * h * f;
}

std::int64_t block_parameters(const ModelSpec& m, int t) {
  const std::int64_t h = m.hidden;
  const std::int64_t f = m.ffn;
  if (m.architecture == Architecture::kGpt) {
    // ln_1, ln_2 (weight, bias: replicated); c_attn column-parallel with its
    // bias; c_proj row-parallel, bias replicated; c_fc column-, mlp.c_proj row-parallel.
    const std::int64_t qkv = shard(3 * h, t);
    const std::int64_t inner = shard(f, t);
    return 4 * h + (h * qkv + qkv) + (shard(h, t) * h + h) + (h * inner + inner) + (inner * h + h);
  }
  // Two RMSNorm weights; Q and O split by heads, K and V by kv heads; gate,
  // up column-parallel, down row-parallel; no biases.
  const std::int64_t kv = shard(static_cast<std::int64_t>(kv_width(m)), t);
  return 2 * h + 2 * h * shard(h, t) + h * kv + 3 * h * shard(f, t);
}

// Activation bytes of one block (Korthikanti et al. 2022 §4.1, generalised):
// `replicated` is split only by sequence parallelism, `sharded` by tensor
// parallelism, `core` (the attention core, s² terms) by tensor parallelism
// and dropped by selective recompute. Dropout masks take 1 byte per element.
//   gpt:   replicated = (4e + 2·drop)·sbh  — inputs of ln_1, QKV, ln_2, fc1; the
//                       attention-output and MLP-output dropout masks
//          sharded    = e·sb·(4h + 2f)     — Q, K, V; out-proj input; GELU input and output
//          core       = (e + drop·(1 + e))·a·s²·b — softmax output; its dropout mask and output
//   For e = 2, drop = 1, f = 4h: 10·sbh, 24·sbh, 5·a·s²·b, Korthikanti's 34 + 5as/h.
//   llama: replicated = 4e·sbh             — inputs of both RMSNorms, of QKV, of gate/up
//          sharded    = e·sb·(2h + 2gd + 3f) — Q, K, V (GQA: K, V are g·d wide);
//                       O's input; SwiGLU keeps gate and up (the fused kernel's
//                       saved input) and its product (down's input)
//          core       = (e + drop·(1 + e))·a·s²·b — GQA shares K/V, not the scores
struct BlockActivations {
  double replicated = 0;
  double sharded = 0;
  double core = 0;
};

BlockActivations block_activations(const ModelSpec& m, const ParallelConfig& c) {
  const double sb = static_cast<double>(c.seq_length) * c.micro_batch;
  const double h = m.hidden;
  const double f = m.ffn;
  const double e = c.bytes_per_element;
  const double drop = m.dropout ? 1 : 0;
  BlockActivations act;
  if (m.architecture == Architecture::kGpt) {
    act.replicated = (4 * e + 2 * drop) * sb * h;
    act.sharded = e * sb * (4 * h + 2 * f);
  } else {
    act.replicated = 4 * e * sb * h;
    act.sharded = e * sb * (2 * h + kv_width(m) + 3 * f);
  }
  act.core = (e + drop * (1 + e)) * m.heads * static_cast<double>(c.seq_length) * sb;
  return act;
}

void validate_config(const ModelSpec& m, const ParallelConfig& c) {
  if (c.micro_batch < 1) fail("micro_batch = {}: must be >= 1", c.micro_batch);
  if (c.seq_length < 1) fail("sequence = {}: must be >= 1 (tokens per sequence)", c.seq_length);
  if (c.tensor_parallel < 1) fail("tensor_parallel = {}: must be >= 1", c.tensor_parallel);
  if (c.bytes_per_element < 1) fail("bytes_per_element = {}: must be >= 1 (2 for bf16)", c.bytes_per_element);
  if (m.architecture == Architecture::kGpt && c.seq_length > m.max_positions) {
    fail("sequence = {}: {} has {} learned positions: use a sequence <= {}", c.seq_length, m.name, m.max_positions,
         m.max_positions);
  }
  if (m.heads % c.tensor_parallel != 0 || m.kv_heads % c.tensor_parallel != 0) {
    fail("tensor_parallel = {}: must divide {}'s heads ({}) and kv heads ({}) so each rank holds whole heads",
         c.tensor_parallel, m.name, m.heads, m.kv_heads);
  }
  if (!m.vision) return;
  const VisionSpec& v = *m.vision;
  if (v.heads % c.tensor_parallel != 0) {
    fail("tensor_parallel = {}: must divide {}'s vision heads ({}) so each rank holds whole heads",
         c.tensor_parallel, m.name, v.heads);
  }
  const int images = image_tokens_per_sequence(m);
  if (c.seq_length <= images) {
    fail("sequence = {}: {}'s sequence holds {} image tokens ({} image(s) of {}) and the text after them: use a "
         "sequence > {} (image and text tokens together)",
         c.seq_length, m.name, images, v.images, image_tokens(v), images);
  }
  if (static_cast<std::int64_t>(c.micro_batch) * v.images > std::numeric_limits<int>::max()) {
    fail("micro_batch = {}: {} images per sequence make {} images per micro-batch, more than pipeflow counts; use a "
         "smaller micro-batch",
         c.micro_batch, v.images, static_cast<std::int64_t>(c.micro_batch) * v.images);
  }
}

// CLIP's embeddings: the patch convolution as a linear map of P²·C pixels,
// the class token, the position table and the pre-LayerNorm (weight, bias).
PipelineLayer patch_embedding_layer(const ModelSpec& m, const ParallelConfig& c) {
  const VisionSpec& v = *m.vision;
  const double images = static_cast<double>(c.micro_batch) * v.images;
  const std::int64_t pixels = static_cast<std::int64_t>(v.patch_size) * v.patch_size * v.channels;
  const double patches = images * patch_tokens(v);
  const double tokens = images * vision_tokens(v);
  PipelineLayer layer;
  layer.name = "vision.patch_embedding";
  layer.kind = LayerKind::kPatchEmbedding;
  layer.parameters = pixels * v.hidden + (v.class_token ? v.hidden : 0) +
                     static_cast<std::int64_t>(vision_tokens(v)) * v.hidden + 2 * v.hidden;
  layer.forward_flops = 2 * patches * static_cast<double>(pixels) * v.hidden;
  layer.backward_weight_flops = layer.forward_flops;
  layer.activation_bytes = c.bytes_per_element * (patches * static_cast<double>(pixels) + tokens * v.hidden);
  return layer;
}

PipelineLayer projector_layer(const ModelSpec& m, const ParallelConfig& c) {
  const VisionSpec& v = *m.vision;
  const double t = c.tensor_parallel;
  const double sp = c.sequence_parallel ? t : 1;
  const double tokens = static_cast<double>(c.micro_batch) * image_tokens_per_sequence(m);
  const std::int64_t h = m.hidden;
  const std::int64_t inner = shard(m.hidden, c.tensor_parallel);
  const double matmul = 2 * tokens * (static_cast<double>(v.hidden) * m.hidden + static_cast<double>(h) * h) / t;
  PipelineLayer layer;
  layer.name = "projector";
  layer.kind = LayerKind::kProjector;
  layer.parameters = (v.hidden * inner + inner) + (inner * h + h);
  layer.forward_flops = matmul;
  layer.backward_input_flops = matmul;
  layer.backward_weight_flops = matmul;
  layer.activation_bytes = c.bytes_per_element * tokens * (v.hidden / sp + 2.0 * m.hidden / t);
  return layer;
}

PipelineLayer embedding_layer(const ModelSpec& m, const ParallelConfig& c) {
  const double sbh = static_cast<double>(c.seq_length) * c.micro_batch * m.hidden;
  const double sp = c.sequence_parallel ? c.tensor_parallel : 1;
  PipelineLayer layer;
  layer.name = "embedding";
  layer.kind = LayerKind::kEmbedding;
  // Token table vocabulary-parallel; GPT's position table replicated.
  layer.parameters = shard(m.vocab, c.tensor_parallel) * m.hidden;
  if (m.architecture == Architecture::kGpt) layer.parameters += static_cast<std::int64_t>(m.max_positions) * m.hidden;
  layer.activation_bytes = m.dropout ? sbh / sp : 0;  // the embedding dropout mask
  return layer;
}

PipelineLayer block_layer(const ModelSpec& m, const ParallelConfig& c, std::string name) {
  const double t = c.tensor_parallel;
  const double bs = static_cast<double>(c.micro_batch) * c.seq_length;
  const double matmul = 2 * bs * block_matrix_weights(m) / t;
  const double core = 4 * bs * c.seq_length * m.hidden / t;  // QKᵀ and probs·V, 2·b·s²·h each
  PipelineLayer layer;
  layer.name = std::move(name);
  layer.kind = LayerKind::kBlock;
  layer.parameters = block_parameters(m, c.tensor_parallel);
  layer.forward_flops = matmul + core;
  layer.backward_input_flops = matmul + 2 * core;
  layer.backward_weight_flops = matmul;
  layer.recompute_flops = c.recompute == Recompute::kFull        ? layer.forward_flops
                          : c.recompute == Recompute::kSelective ? core
                                                                 : 0;
  layer.activation_bytes = block_activation_bytes(m, c);
  return layer;
}

PipelineLayer head_layer(const ModelSpec& m, const ParallelConfig& c) {
  const double t = c.tensor_parallel;
  const double sp = c.sequence_parallel ? t : 1;
  const double bs = static_cast<double>(c.micro_batch) * c.seq_length;
  const double logits = 2 * bs * m.hidden * static_cast<double>(m.vocab) / t;
  const std::int64_t norm = m.architecture == Architecture::kGpt ? 2 * m.hidden : m.hidden;
  const std::int64_t lm_head = shard(m.vocab, c.tensor_parallel) * m.hidden;
  PipelineLayer layer;
  layer.name = "head";
  layer.kind = LayerKind::kHead;
  layer.parameters = norm + (m.tied_embeddings ? 0 : lm_head);
  if (m.tied_embeddings) {
    layer.tied_parameters = lm_head;
    layer.tied_owner = 0;
  }
  layer.forward_flops = logits;
  layer.backward_input_flops = logits;
  layer.backward_weight_flops = logits;
  // Inputs of the final norm and of the LM head, and the fp32 logits that the
  // vocabulary-parallel cross entropy keeps for its backward.
  layer.activation_bytes = 2.0 * c.bytes_per_element * bs * m.hidden / sp + 4.0 * bs * m.vocab / t;
  return layer;
}

}  // namespace

double block_activation_bytes(const ModelSpec& m, const ParallelConfig& c) {
  const double t = c.tensor_parallel;
  const double sp = c.sequence_parallel ? t : 1;
  const double sbh = static_cast<double>(c.seq_length) * c.micro_batch * m.hidden;
  const BlockActivations act = block_activations(m, c);
  switch (c.recompute) {
    case Recompute::kNone: return act.replicated / sp + (act.sharded + act.core) / t;
    case Recompute::kSelective: return act.replicated / sp + act.sharded / t;
    // Only the block's input is kept; with SP it is the sequence shard (as Megatron stores it).
    case Recompute::kFull: return c.bytes_per_element * sbh / sp;
  }
  return 0;
}

std::string_view to_string(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

std::string_view to_string(LayerKind kind) {
  switch (kind) {
    case LayerKind::kEmbedding: return "embedding";
    case LayerKind::kBlock: return "block";
    case LayerKind::kHead: return "head";
    case LayerKind::kPatchEmbedding: return "patch_embedding";
    case LayerKind::kVisionBlock: return "vision_block";
    case LayerKind::kProjector: return "projector";
  }
  return "?";
}

bool is_block(LayerKind kind) { return kind == LayerKind::kBlock || kind == LayerKind::kVisionBlock; }

ModelSpec vision_block_model(const ModelSpec& spec) {
  if (!spec.vision) fail("internal: {} has no vision tower", spec.name);
  const VisionSpec& v = *spec.vision;
  ModelSpec block = gpt_model(spec.name + " vision", v.layers, v.hidden, v.heads, 1, vision_tokens(v));
  block.ffn = v.ffn;
  return block;
}

ParallelConfig vision_block_config(const ModelSpec& spec, const ParallelConfig& config) {
  if (!spec.vision) fail("internal: {} has no vision tower", spec.name);
  ParallelConfig images = config;
  images.micro_batch = config.micro_batch * spec.vision->images;
  images.seq_length = vision_tokens(*spec.vision);
  return images;
}

int pipeline_layer_count(const ModelSpec& spec) {
  return spec.layers + 2 + (spec.vision ? spec.vision->layers + 2 : 0);
}

int image_tokens_per_sequence(const ModelSpec& spec) {
  return spec.vision ? spec.vision->images * image_tokens(*spec.vision) : 0;
}

Recompute parse_recompute(std::string_view text) {
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (text == to_string(mode)) return mode;
  }
  fail("recompute {}: use none, selective or full", quoted_excerpt(text));
}

std::vector<PipelineLayer> pipeline_layers(const ModelSpec& spec, const ParallelConfig& config) {
  validate_model(spec);
  validate_config(spec, config);
  const bool split_messages = config.sequence_parallel || config.scatter_gather;
  // e·rows·width, the activation one layer hands the next (÷t when split).
  const auto message = [&](double rows, double width) {
    return config.bytes_per_element * rows * width / (split_messages ? config.tensor_parallel : 1);
  };
  std::vector<PipelineLayer> layers;
  layers.reserve(static_cast<std::size_t>(pipeline_layer_count(spec)));
  if (spec.vision) {
    const ModelSpec tower = vision_block_model(spec);
    const ParallelConfig images = vision_block_config(spec, config);
    layers.push_back(patch_embedding_layer(spec, config));
    for (int i = 0; i < tower.layers; ++i) {
      layers.push_back(block_layer(tower, images, fmt::format("vision.block.{}", i)));
      layers.back().kind = LayerKind::kVisionBlock;
    }
    for (PipelineLayer& layer : layers) {
      layer.output_bytes = message(static_cast<double>(images.micro_batch) * images.seq_length, tower.hidden);
    }
    layers.push_back(projector_layer(spec, config));
    layers.back().output_bytes =
        message(static_cast<double>(config.micro_batch) * image_tokens_per_sequence(spec), spec.hidden);
  }
  const std::size_t first_text_layer = layers.size();
  layers.push_back(embedding_layer(spec, config));
  for (int i = 0; i < spec.layers; ++i) layers.push_back(block_layer(spec, config, fmt::format("block.{}", i)));
  for (std::size_t i = first_text_layer; i < layers.size(); ++i) {
    layers[i].output_bytes = message(static_cast<double>(config.micro_batch) * config.seq_length, spec.hidden);
  }
  layers.push_back(head_layer(spec, config));
  if (spec.tied_embeddings) layers.back().tied_owner = static_cast<int>(first_text_layer);
  for (PipelineLayer& layer : layers) layer.trainable_parameters = layer.parameters;
  return layers;
}

LayerTotals sum_layers(const std::vector<PipelineLayer>& layers, int first, int end) {
  if (first < 0 || end > static_cast<int>(layers.size()) || first > end) {
    fail("internal: layer range [{}, {}) outside 0..{}", first, end, layers.size());
  }
  LayerTotals totals;
  for (int i = first; i < end; ++i) {
    const PipelineLayer& layer = layers[i];
    totals.parameters += layer.parameters;
    totals.trainable_parameters += layer.trainable_parameters;
    const bool owner_outside = layer.tied_owner >= 0 && (layer.tied_owner < first || layer.tied_owner >= end);
    if (owner_outside) totals.parameters += layer.tied_parameters;
    if (owner_outside && !layer.frozen) totals.trainable_parameters += layer.tied_parameters;
    totals.forward_flops += layer.forward_flops;
    totals.backward_input_flops += layer.backward_input_flops;
    totals.backward_weight_flops += layer.backward_weight_flops;
    totals.recompute_flops += layer.recompute_flops;
    totals.activation_bytes += layer.activation_bytes;
  }
  return totals;
}

}  // namespace pipeflow
