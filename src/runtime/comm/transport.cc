#include "pipeflow/runtime/transport.h"

#include <fmt/format.h>

namespace pipeflow::runtime {

const char* to_string(Direction direction) {
  switch (direction) {
    case Direction::kActivation:
      return "activation";
    case Direction::kGradient:
      return "gradient";
    case Direction::kTiedGradient:
      return "tied gradient";
    case Direction::kSampledTokens:
      return "sampled tokens";
  }
  return "?";
}

std::string describe(const MessageKey& key) {
  if (key.direction == Direction::kTiedGradient) {
    return fmt::format("tied wte gradient of stage {} (rank {} -> rank {})", key.stage, key.source,
                       key.destination);
  }
  return fmt::format("{} of micro-batch {} from stage {} (rank {} -> rank {})", to_string(key.direction),
                     key.microbatch, key.stage, key.source, key.destination);
}

// Direction, then stage, then micro-batch: dense and in a known range, so
// the constructor can check it against the MPI library's largest tag.
int message_tag(const MessageKey& key, int num_stages, int num_microbatches) {
  return (static_cast<int>(key.direction) * num_stages + key.stage.value()) * num_microbatches +
         key.microbatch.value();
}

std::int64_t message_tags(int num_stages, int num_microbatches) {
  constexpr std::int64_t kDirections = 4;
  return kDirections * num_stages * num_microbatches;
}

}  // namespace pipeflow::runtime
