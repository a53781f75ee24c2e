#include "pipeflow/nn/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pipeflow/core/error.h"

namespace pipeflow::nn {
namespace {

// Zeroes the weights of the tokens top_k and top_p leave out.
void keep_most_likely(std::vector<double>& weights, double total, int top_k, double top_p) {
  std::vector<std::size_t> order(weights.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return weights[a] > weights[b]; });
  std::size_t keep = top_k > 0 ? std::min(order.size(), static_cast<std::size_t>(top_k)) : order.size();
  double mass = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    mass += weights[order[i]];
    if (top_p < 1 && mass >= top_p * total) keep = i + 1;
  }
  for (std::size_t i = keep; i < order.size(); ++i) weights[order[i]] = 0;
}

}  // namespace

void SamplingOptions::validate() const {
  if (new_tokens < 1) fail("--max-new-tokens {}: must be at least 1", new_tokens);
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    fail("--temperature {}: must be a finite number >= 0 (0 = greedy)", temperature);
  }
  if (top_k < 0) fail("--top-k {}: must be >= 0 (0 keeps every token)", top_k);
  if (!(top_p > 0 && top_p <= 1)) fail("--top-p {}: must lie in (0, 1] (1 keeps every token)", top_p);
}

std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& options, Rng& rng) {
  if (options.temperature <= 0) {
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> weights(logits.size());
  double total = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    weights[i] = std::exp((logits[i] - top) / options.temperature);
    total += weights[i];
  }
  if (options.top_k > 0 || options.top_p < 1) {
    keep_most_likely(weights, total, options.top_k, options.top_p);
    total = std::accumulate(weights.begin(), weights.end(), 0.0);
  }
  double u = rng.uniform() * total;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    u -= weights[i];
    if (u < 0 && weights[i] > 0) return static_cast<std::int32_t>(i);
  }
  const auto last = std::find_if(weights.rbegin(), weights.rend(), [](double w) { return w > 0; });
  return static_cast<std::int32_t>(weights.rend() - last - 1);
}

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
    sequence.push_back(sample_token(logits.span().subspan(static_cast<std::size_t>((window - 1) * vocab)), options, rng));
  }
  return {sequence.begin() + static_cast<std::ptrdiff_t>(prompt.size()), sequence.end()};
}

std::vector<std::int32_t> encode_text(std::string_view text) {
  std::vector<std::int32_t> tokens;
  for (const char c : text.empty() ? std::string_view("\n") : text) tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

std::string decode_tokens(std::span<const std::int32_t> tokens) {
  std::string text;
  for (const std::int32_t token : tokens) text += token < 256 ? static_cast<char>(token) : '?';
  return text;
}

std::string sample_text(Stage& model, std::string_view prompt, const SamplingOptions& options) {
  return decode_tokens(generate(model, encode_text(prompt), options));
}

}  // namespace pipeflow::nn
