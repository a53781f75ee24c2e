#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/nn/random.h"
#include "pipeflow/nn/stage.h"

namespace pipeflow::nn {

struct SamplingOptions {
  int new_tokens = 200;
  // 0: greedy (argmax); > 0: softmax(logits / temperature) sampled with `seed`.
  double temperature = 0.0;
  std::uint64_t seed = 0;
  // With temperature > 0, the tokens a draw may pick: the top_k most likely
  // (0: all), and of those the fewest most likely whose probabilities sum to
  // at least top_p (1: all; nucleus sampling, Holtzman et al. 2020).
  int top_k = 0;
  double top_p = 1.0;

  // Error naming the option (--temperature, --top-k, --top-p,
  // --max-new-tokens), its value and the rule.
  void validate() const;
};

// One token from a row of logits [V]: the first argmax at temperature 0, else
// a draw from `rng` over the tokens top_k and top_p keep, in proportion to
// exp((logit − max) / temperature). Ties in top-k/top-p go to the lower id.
std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& options, Rng& rng);

// Continues `prompt` autoregressively with a stage holding the whole model,
// each token from the logits of the last position, conditioning on at most
// the model's context, recomputing the whole window for every token (no
// cache). Returns only the new tokens. Deterministic for a seed.
std::vector<std::int32_t> generate(Stage& model, std::span<const std::int32_t> prompt,
                                   const SamplingOptions& options);

// Byte-level text to tokens: an empty prompt starts from a newline, as every
// training sample of the byte dataset follows one.
std::vector<std::int32_t> encode_text(std::string_view text);
// Tokens to byte-level text; a token past the bytes (vocabulary > 256) is '?'.
std::string decode_tokens(std::span<const std::int32_t> tokens);

// Byte-level text in, text out (an empty prompt starts from a newline).
std::string sample_text(Stage& model, std::string_view prompt, const SamplingOptions& options);

}  // namespace pipeflow::nn
