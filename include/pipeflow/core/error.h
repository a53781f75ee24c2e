#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace pipeflow {

// The one exception type of pipeflow. Its message is written for the user who
// must act on it: what was wrong, the offending value, the rule it broke, and
// what to do instead, e.g.
//   1f1b needs microbatches >= stages (got 3 < 4): raise
//   gradient_accumulation_steps or use gpipe
// Library code throws it; the command line prints the message and exits 1.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws Error with a fmt-formatted message.
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace pipeflow
