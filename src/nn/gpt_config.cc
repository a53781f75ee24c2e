#include "pipeflow/nn/gpt_config.h"

#include <fmt/format.h>

#include "pipeflow/core/error.h"

namespace pipeflow::nn {

void GptConfig::validate() const {
  auto require_in_range = [](const char* field, int value, int most) {
    if (value <= 0) fail("model {} = {}: must be positive", field, value);
    if (value > most) fail("model {} = {}: must be at most {}", field, value, most);
  };
  require_in_range("vocab_size", vocab_size, kMaxVocab);
  require_in_range("context", context, kMaxContext);
  require_in_range("n_layer", n_layer, kMaxLayers);
  require_in_range("n_head", n_head, kMaxWidth);
  require_in_range("n_embd", n_embd, kMaxWidth);
  if (n_embd % n_head != 0) {
    fail("model n_embd = {} is not a multiple of n_head = {}: every head needs n_embd / n_head features", n_embd,
         n_head);
  }
}

std::int64_t GptConfig::parameter_count() const {
  const std::int64_t c = n_embd;
  return static_cast<std::int64_t>(vocab_size) * c + static_cast<std::int64_t>(context) * c +
         n_layer * (12 * c * c + 13 * c) + 2 * c;
}

std::string pipeline_layer_name(const GptConfig& config, int layer) {
  if (layer == 0) return "embedding";
  if (layer == config.n_layer + 1) return "head";
  return fmt::format("block.{}", layer - 1);
}

void validate_range(const GptConfig& config, LayerRange range) {
  if (range.first < 0 || range.last > config.pipeline_layers() || range.first >= range.last) {
    fail("layer range [{}, {}) is not a non-empty range of the model's {} pipeline layers (embedding, {} blocks, "
         "head)",
         range.first, range.last, config.pipeline_layers(), config.n_layer);
  }
}

}  // namespace pipeflow::nn
