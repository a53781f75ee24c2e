#pragma once

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace pipeflow {

enum class LogLevel { kDebug, kInfo, kWarning, kError, kQuiet };

// Messages at or above the level go to standard error, each as one line.
// Thread safety: all functions may be called from any thread.
void set_log_level(LogLevel level);
LogLevel log_level();
void log_line(LogLevel level, std::string_view message);

template <class... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() <= LogLevel::kDebug) {
    log_line(LogLevel::kDebug, fmt::format(format, std::forward<Args>(args)...));
  }
}
template <class... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() <= LogLevel::kInfo) {
    log_line(LogLevel::kInfo, fmt::format(format, std::forward<Args>(args)...));
  }
}
template <class... Args>
void log_warning(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() <= LogLevel::kWarning) {
    log_line(LogLevel::kWarning, fmt::format(format, std::forward<Args>(args)...));
  }
}

}  // namespace pipeflow
