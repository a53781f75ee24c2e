#include "pipeflow/nn/sampling.h"

#include <algorithm>
#include <cmath>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/random.h"

namespace pipeflow::nn {
namespace {

std::int32_t pick(std::span<const float> logits, double temperature, Rng& rng) {
  if (temperature <= 0) {
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> weights(logits.size());
  double total = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    weights[i] = std::exp((logits[i] - top) / temperature);
    total += weights[i];
  }
  double u = rng.uniform() * total;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    u -= weights[i];
    if (u < 0) return static_cast<std::int32_t>(i);
  }
  return static_cast<std::int32_t>(weights.size() - 1);
}

}  // namespace

std::vector<std::int32_t> generate(Stage& model, std::span<const std::int32_t> prompt,
                                   const SamplingOptions& options) {
  if (prompt.empty()) fail("sampling needs a prompt of at least one token");
  std::vector<std::int32_t> sequence(prompt.begin(), prompt.end());
  Rng rng(options.seed);
  const int vocab = model.config().vocab_size;
  for (int i = 0; i < options.new_tokens; ++i) {
    const auto window = static_cast<std::int64_t>(
        std::min<std::size_t>(sequence.size(), static_cast<std::size_t>(model.config().context)));
    IntTensor tokens{Shape{1, window}};
    std::copy(sequence.end() - window, sequence.end(), tokens.data());
    const Tensor logits = model.logits(tokens);
    sequence.push_back(pick(logits.span().subspan(static_cast<std::size_t>((window - 1) * vocab)), options.temperature, rng));
  }
  return {sequence.begin() + static_cast<std::ptrdiff_t>(prompt.size()), sequence.end()};
}

std::string sample_text(Stage& model, std::string_view prompt, const SamplingOptions& options) {
  std::vector<std::int32_t> tokens;
  for (const char c : prompt.empty() ? std::string_view("\n") : prompt) tokens.push_back(static_cast<unsigned char>(c));
  std::string text;
  for (const std::int32_t token : generate(model, tokens, options)) {
    text += token < 256 ? static_cast<char>(token) : '?';
  }
  return text;
}

}  // namespace pipeflow::nn
