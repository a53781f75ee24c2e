#pragma once

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace pipeflow {

// A warning: something the user should know that does not stop the command,
// printed as one line "warning: ..." on standard error. Commands print their
// own progress and results; this is the only shared output channel.
// Thread safety: may be called from any thread; lines never interleave.
void print_warning(std::string_view message);

template <class... Args>
void log_warning(fmt::format_string<Args...> format, Args&&... args) {
  print_warning(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace pipeflow
