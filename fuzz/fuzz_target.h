#pragma once

// The body every pipeflow fuzz target shares: the input is a file's bytes,
// the reader must either return or throw pipeflow::Error (a clear message
// for the user). Anything else — a crash, a sanitizer report, another
// exception (std::bad_alloc, a JSON library's own), a hang, unbounded
// memory (libFuzzer's -rss_limit_mb) — is a defect the fuzzer reports.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "pipeflow/core/error.h"

#define PIPEFLOW_FUZZ_READER(call)                                                                   \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {                \
    const std::string_view text(reinterpret_cast<const char*>(data), size);                          \
    try {                                                                                            \
      call;                                                                                          \
    } catch (const pipeflow::Error&) {                                                               \
    }                                                                                                \
    return 0;                                                                                        \
  }
