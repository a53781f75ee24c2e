#pragma once

// Whether the tests are built with AddressSanitizer or ThreadSanitizer
// (clang's and gcc's spellings): such a build, and the pipeflow executable
// beside it, runs 10-50x slower, so the widest sweeps test a subset there.
// The sanitizers look for races and bad accesses, which the subset shows;
// the release build runs every case.

namespace pipeflow::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PIPEFLOW_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PIPEFLOW_TEST_SANITIZED 1
#endif
#endif
#ifdef PIPEFLOW_TEST_SANITIZED
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace pipeflow::testing
