#include "pipeflow/core/log.h"

#include <cstdio>
#include <mutex>

namespace pipeflow {

void print_warning(std::string_view message) {
  static std::mutex output;
  std::lock_guard lock(output);
  std::fprintf(stderr, "warning: %.*s\n", static_cast<int>(message.size()), message.data());
}

}  // namespace pipeflow
