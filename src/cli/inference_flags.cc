#include "inference_flags.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "pipeflow/core/error.h"

namespace pipeflow::cli {
namespace {

template <class T>
void require_positive(const char* flag, const std::optional<T>& value, const char* what) {
  if (value) require_positive_flag(flag, *value, what);
}

}  // namespace

// `what` says what the count is, so that the message gives the rule's reason.
void require_positive_flag(const char* flag, std::int64_t value, const char* what) {
  if (value < 1) fail("{} {}: must be >= 1 ({}); leave the flag out for its default", flag, value, what);
}

CLI::Validator prefill_chunk_validator() {
  return CLI::Validator(
      [](const std::string& value) -> std::string {
        const bool digits = !value.empty() && value.size() <= 9 &&
                            std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (digits) return {};
        return value + " is not an integer >= 0 (tokens of a prompt each prefill chunk carries through the stages, "
                       "at most 9 digits; 0: the whole prompt in one piece): give e.g. --prefill-chunk 128, or 0";
      },
      "TOKENS >= 0");
}

void InferenceFlags::add_to(CLI::App* command, bool with_microbatches) {
  command->add_option("--context", context,
                      "--inference: tokens of each sequence the KV cache holds (default --seq, else the model's)");
  command->add_option("--sequences", sequences, "--inference: concurrent sequences (default 1)");
  command->add_option("--prompt-tokens", prompt_tokens, "--inference: tokens of each prompt (default the context)");
  command
      ->add_option("--prefill-chunk", prefill_chunk,
                   fmt::format("--inference: tokens per prefill chunk, the chunks pipelined through the stages "
                               "(default {}; 0: a group's prompts in one piece)",
                               kPrefillChunkTokens))
      ->check(prefill_chunk_validator());
  if (with_microbatches) {
    command->add_option("--microbatches", microbatches,
                        "--inference: groups of sequences in flight (default min(stages, sequences))");
  }
}

bool InferenceFlags::any_given() const { return context || sequences || prompt_tokens || microbatches || prefill_chunk; }

void InferenceFlags::apply(InferenceSetup& setup, std::int64_t default_context) const {
  require_positive("--context", context, "tokens the KV cache holds per sequence");
  require_positive("--sequences", sequences, "concurrent sequences");
  require_positive("--prompt-tokens", prompt_tokens, "tokens of each prompt");
  require_positive("--microbatches", microbatches, "groups of sequences, each of at least one");
  setup.context = context.value_or(default_context);
  setup.sequences = sequences.value_or(1);
  setup.prompt_tokens = prompt_tokens.value_or(0);
  setup.microbatches = microbatches.value_or(0);
  setup.prefill_chunk = prefill_chunk.value_or(kPrefillChunkTokens);
}

}  // namespace pipeflow::cli
