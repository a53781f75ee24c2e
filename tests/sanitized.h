#pragma once

// Whether the tests are built with AddressSanitizer or ThreadSanitizer
// (pipeflow/core/sanitizers.h): such a build, and the pipeflow executable
// beside it, runs 10-50x slower, so the widest sweeps test a subset there.
// The sanitizers look for races and bad accesses, which the subset shows;
// the release build runs every case.

#include "pipeflow/core/sanitizers.h"

namespace pipeflow::testing {

inline constexpr bool kSanitized = kAddressSanitizer || kThreadSanitizer;

}  // namespace pipeflow::testing
