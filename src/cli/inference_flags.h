#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>

#include "pipeflow/sim/inference.h"

namespace pipeflow::cli {

// Refuses a count given on the command line below 1: "--context -1: must be
// >= 1 (what); leave the flag out for its default".
void require_positive_flag(const char* flag, std::int64_t value, const char* what);

// --prefill-chunk's check, before CLI11 converts the text: an integer >= 0,
// else "--prefill-chunk: abc is not an integer >= 0 (...): give ...".
CLI::Validator prefill_chunk_validator();

// The flags that shape a generation for `simulate --inference` and `plan
// --inference`: --context, --sequences, --prompt-tokens, --prefill-chunk
// (>= 0, prefill_chunk_validator) and (simulate's alone) --microbatches. A flag left out takes its default; one given must
// be >= 1: 0 or a negative count is refused naming the flag, never read as
// "the default" (the setup's own checks, predict_inference's, then bound it
// above).
struct InferenceFlags {
  std::optional<std::int64_t> context;
  std::optional<int> sequences;  // 1 when left out
  std::optional<std::int64_t> prompt_tokens;
  std::optional<int> microbatches;
  std::optional<std::int64_t> prefill_chunk;  // kPrefillChunkTokens when left out; 0: a group's prompts at once

  void add_to(CLI::App* command, bool with_microbatches);
  // Whether any of them was given: they are refused without --inference.
  bool any_given() const;
  // Refuses a count < 1, then sets setup's context (default_context when
  // --context is left out: 0 is the model's), sequences, prompt tokens and
  // micro-batches (0 when left out: predict_inference's defaults).
  void apply(InferenceSetup& setup, std::int64_t default_context) const;
};

}  // namespace pipeflow::cli
