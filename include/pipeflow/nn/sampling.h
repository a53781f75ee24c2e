#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/nn/stage.h"

namespace pipeflow::nn {

struct SamplingOptions {
  int new_tokens = 200;
  // 0: greedy (argmax); > 0: softmax(logits / temperature) sampled with `seed`.
  double temperature = 0.0;
  std::uint64_t seed = 0;
};

// Continues `prompt` autoregressively with a stage holding the whole model,
// each token from the logits of the last position, conditioning on at most
// the model's context. Returns only the new tokens. Deterministic for a seed.
std::vector<std::int32_t> generate(Stage& model, std::span<const std::int32_t> prompt,
                                   const SamplingOptions& options);

// Byte-level text in, text out (an empty prompt starts from a newline).
std::string sample_text(Stage& model, std::string_view prompt, const SamplingOptions& options);

}  // namespace pipeflow::nn
