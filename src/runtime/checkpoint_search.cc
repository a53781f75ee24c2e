#include "pipeflow/runtime/checkpoint_search.h"

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "pipeflow/core/error.h"

namespace pipeflow::runtime {

std::filesystem::path checkpoint_to_resume(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) {
    fail("checkpoint.load = {}: no such file or directory: give a checkpoint file or the directory that "
         "checkpoint.dir names",
         path.string());
  }
  if (!std::filesystem::is_directory(path)) return path;
  std::filesystem::path latest;
  std::int64_t latest_steps = -1;
  constexpr std::string_view kPrefix = "step_", kSuffix = ".safetensors";
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) continue;
    const std::string_view digits =
        std::string_view(name).substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
    std::int64_t steps = -1;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), steps);
    if (error != std::errc() || end != digits.data() + digits.size()) continue;
    if (steps > latest_steps) {
      latest_steps = steps;
      latest = entry.path();
    }
  }
  if (latest.empty()) {
    fail("checkpoint.load = {}: the directory holds no step_N.safetensors: give a checkpoint file", path.string());
  }
  return latest;
}

}  // namespace pipeflow::runtime
