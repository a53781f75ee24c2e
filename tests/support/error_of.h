#pragma once

#include <functional>
#include <string>

#include "pipeflow/core/error.h"

namespace pipeflow::testing {

// The message of the pipeflow::Error that `body` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace pipeflow::testing
