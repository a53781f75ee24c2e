#pragma once

// A benchmark's command line: "--name value" pairs, and switches without a
// value. Every bench parses through it, so that each answers --help with its
// usage (exit 0) and refuses what it does not take (exit 2) rather than
// running on: a lone last word or a flag without its value included.

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <variant>

namespace pipeflow::bench {

struct Flag {
  const char* name;
  // int and double: a number; string: any word; bool: a switch, set by its
  // name alone.
  std::variant<int*, double*, std::string*, bool*> target;
};

inline std::string flag_usage(const Flag& flag) {
  struct Default {
    std::string operator()(const int* v) const { return std::to_string(*v); }
    std::string operator()(const double* v) const {
      char text[32];
      std::snprintf(text, sizeof text, "%g", *v);
      return text;
    }
    std::string operator()(const std::string* v) const { return *v; }
    std::string operator()(const bool*) const { return {}; }
  };
  const std::string value = std::visit(Default{}, flag.target);
  return std::holds_alternative<bool*>(flag.target) ? std::string(" [") + flag.name + "]"
                                                    : std::string(" [") + flag.name + " " + value + "]";
}

// Sets each flag's target from the command line. --help or -h prints
// "usage: <program> [--name default]..." and exits 0; an unknown flag, a
// flag without its value or a number that does not parse exits 2 naming it.
inline void parse_flags(int argc, char** argv, std::initializer_list<Flag> flags) {
  std::string usage = std::string("usage: ") + argv[0];
  for (const Flag& flag : flags) usage += flag_usage(flag);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("%s\n", usage.c_str());
      std::exit(0);
    }
    const Flag* flag = nullptr;
    for (const Flag& candidate : flags) {
      if (std::strcmp(argv[i], candidate.name) == 0) flag = &candidate;
    }
    if (flag == nullptr) {
      std::fprintf(stderr, "unknown option %s\n%s\n", argv[i], usage.c_str());
      std::exit(2);
    }
    if (bool* const* on = std::get_if<bool*>(&flag->target)) {
      **on = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n%s\n", argv[i], usage.c_str());
      std::exit(2);
    }
    const char* value = argv[++i];
    char* end = nullptr;
    errno = 0;
    if (int* const* number = std::get_if<int*>(&flag->target)) {
      const long parsed = std::strtol(value, &end, 10);
      if (end != value && *end == '\0' && errno == 0 && parsed >= -2147483647L - 1 && parsed <= 2147483647L) {
        **number = static_cast<int>(parsed);
        continue;
      }
    } else if (double* const* real = std::get_if<double*>(&flag->target)) {
      const double parsed = std::strtod(value, &end);
      if (end != value && *end == '\0' && errno == 0) {
        **real = parsed;
        continue;
      }
    } else {
      *std::get<std::string*>(flag->target) = value;
      continue;
    }
    std::fprintf(stderr, "%s %s: not a number\n%s\n", flag->name, value, usage.c_str());
    std::exit(2);
  }
}

}  // namespace pipeflow::bench
