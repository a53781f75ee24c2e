#pragma once

// Integer flags of a benchmark's command line, "--name value" pairs.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

namespace pipeflow::bench {

// Sets the int each flag names from the value after it; an unknown flag
// exits 2 naming it.
inline void parse_int_flags(int argc, char** argv, std::initializer_list<std::pair<const char*, int*>> flags) {
  for (int i = 1; i + 1 < argc; i += 2) {
    int* target = nullptr;
    for (const auto& [name, value] : flags) {
      if (std::strcmp(argv[i], name) == 0) target = value;
    }
    if (target == nullptr) {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      std::exit(2);
    }
    *target = std::atoi(argv[i + 1]);
  }
}

}  // namespace pipeflow::bench
