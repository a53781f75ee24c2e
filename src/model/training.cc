#include "pipeflow/model/training.h"

#include <fmt/format.h>

#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

struct Matrix {
  std::string_view name;
  double in = 0;
  double out = 0;
};

// The weight matrices of one language-model block, by PEFT's names.
std::vector<Matrix> block_matrices(const ModelSpec& m) {
  const double h = m.hidden;
  const double f = m.ffn;
  if (m.architecture == Architecture::kGpt) {
    return {{"c_attn", h, 3 * h}, {"c_proj", h, h}, {"c_fc", h, f}, {"c_proj", f, h}};
  }
  const double kv = kv_width(m) / 2;
  return {{"q_proj", h, h},    {"k_proj", h, kv}, {"v_proj", h, kv},  {"o_proj", h, h},
          {"gate_proj", h, f}, {"up_proj", h, f}, {"down_proj", f, h}};
}

std::string matrix_names(const ModelSpec& m) {
  std::string names;
  for (const Matrix& matrix : block_matrices(m)) {
    if (names.find(matrix.name) != std::string::npos) continue;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", matrix.name);
  }
  return names;
}

bool any_matches(const std::vector<std::string>& patterns, std::string_view name) {
  for (const std::string& pattern : patterns) {
    if (glob_matches(pattern, name)) return true;
  }
  return false;
}

void check_patterns_match(const std::vector<std::string>& patterns, const std::vector<PipelineLayer>& layers,
                          std::string_view key, const ModelSpec& spec) {
  for (const std::string& pattern : patterns) {
    bool matched = false;
    for (const PipelineLayer& layer : layers) matched = matched || glob_matches(pattern, layer.name);
    if (!matched) {
      fail("{} {}: matches no layer of {} ({} .. {}); patterns are globs over whole layer names ('*' any run "
           "of characters, '?' one): e.g. \"vision.*\", \"block.*\", \"embedding\"",
           key, quoted_excerpt(pattern), spec.name, layers.front().name, layers.back().name);
    }
  }
}

// The adapters' parameters and per-token multiply-adds of one block, on one
// of t ranks: Σ r·(in + out) over the targeted matrices, ÷t.
struct Adapters {
  std::int64_t parameters = 0;
  double weights = 0;  // per token, on this rank
  int matrices = 0;    // adapted matrices (GPT's c_proj names two)
};

Adapters block_adapters(const ModelSpec& m, const LoraSpec& lora, int t) {
  Adapters out;
  for (const Matrix& matrix : block_matrices(m)) {
    bool targeted = false;
    for (const std::string& target : lora.targets) targeted = targeted || target == matrix.name;
    if (!targeted) continue;
    const double weights = lora.rank * (matrix.in + matrix.out);
    out.parameters += (static_cast<std::int64_t>(weights) + t - 1) / t;
    out.weights += weights / t;
    ++out.matrices;
  }
  return out;
}

}  // namespace

bool glob_matches(std::string_view pattern, std::string_view name) {
  // Iterative matching with one backtrack point, the last '*'.
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

void validate_training(const TrainingSpec& training, const ModelSpec& spec) {
  for (const std::string& pattern : training.freeze) {
    if (pattern.empty()) fail("freeze \"\": an empty pattern matches no layer; name layers, e.g. \"vision.*\"");
  }
  if (!training.lora) return;
  const LoraSpec& lora = *training.lora;
  if (lora.rank < 1 || lora.rank > kMaxModelWidth) {
    fail("lora.r = {}: must lie in [1, {}] (the adapters' rank; 8 to 64 are usual)", lora.rank, kMaxModelWidth);
  }
  if (!(lora.alpha > 0)) fail("lora.alpha = {}: must be > 0 (the update is scaled by alpha / r; 16 is usual)", lora.alpha);
  if (lora.targets.empty()) {
    fail("lora.target = []: name the matrices to adapt, e.g. [\"q_proj\", \"v_proj\"]; {} has {}", spec.name,
         matrix_names(spec));
  }
  for (const std::string& target : lora.targets) {
    bool known = false;
    for (const Matrix& matrix : block_matrices(spec)) known = known || matrix.name == target;
    if (!known) {
      fail("lora.target {}: {} is a {} model, whose block matrices are {}: use those names", quoted_excerpt(target),
           spec.name, to_string(spec.architecture), matrix_names(spec));
    }
  }
}

void apply_training(std::vector<PipelineLayer>& layers, const ModelSpec& spec, const ParallelConfig& config,
                    const TrainingSpec& training) {
  if (training.trains_everything()) return;
  validate_training(training, spec);
  check_patterns_match(training.freeze, layers, "freeze", spec);
  if (training.lora) check_patterns_match(training.lora->train, layers, "lora.train", spec);
  const double tokens = static_cast<double>(config.micro_batch) * config.seq_length;
  for (PipelineLayer& layer : layers) {
    const bool adapted = training.lora && layer.kind == LayerKind::kBlock;
    const bool kept_whole = training.lora && !adapted && any_matches(training.lora->train, layer.name);
    const bool named_frozen = any_matches(training.freeze, layer.name);
    layer.frozen = named_frozen || (training.lora && !kept_whole);
    if (!layer.frozen) continue;
    layer.trainable_parameters = 0;
    layer.backward_weight_flops = 0;
    if (!adapted || named_frozen) continue;
    const Adapters adapters = block_adapters(spec, *training.lora, config.tensor_parallel);
    const double flops = 2 * tokens * adapters.weights;
    layer.parameters += adapters.parameters;
    layer.trainable_parameters = adapters.parameters;
    layer.adapter_flops = flops;
    layer.forward_flops += flops;
    layer.backward_input_flops += flops;
    layer.backward_weight_flops = flops;
    if (config.recompute == Recompute::kFull) layer.recompute_flops += flops;
    const double kept = config.recompute == Recompute::kFull ? 0 : 1;  // full keeps the block's input only
    layer.activation_bytes +=
        kept * config.bytes_per_element * tokens * training.lora->rank * adapters.matrices / config.tensor_parallel;
  }
  for (PipelineLayer& layer : layers) {
    if (!layer.frozen || layer.trainable_parameters > 0) break;
    layer.backward = false;
    layer.backward_input_flops = 0;
    layer.recompute_flops = 0;
    layer.activation_bytes = 0;
  }
}

}  // namespace pipeflow
