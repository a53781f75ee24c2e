#include "pipeflow/core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace pipeflow {
namespace {

std::atomic<LogLevel> g_level{LogLevel::kInfo};
std::mutex g_output;

const char* prefix(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug: ";
    case LogLevel::kWarning: return "warning: ";
    case LogLevel::kError: return "error: ";
    case LogLevel::kInfo:
    case LogLevel::kQuiet: return "";
  }
  return "";
}

}  // namespace

void set_log_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(); }

void log_line(LogLevel level, std::string_view message) {
  if (level < log_level()) return;
  std::lock_guard lock(g_output);
  std::fprintf(stderr, "%s%.*s\n", prefix(level), static_cast<int>(message.size()), message.data());
}

}  // namespace pipeflow
