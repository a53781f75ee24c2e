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

}  // namespace pipeflow::runtime
