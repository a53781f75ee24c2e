#include "pipeflow/runtime/checkpoint_search.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/safetensors.h"

namespace pipeflow::runtime {

std::vector<std::filesystem::path> checkpoints_in(const std::filesystem::path& dir) {
  std::vector<std::pair<std::int64_t, std::filesystem::path>> found;
  constexpr std::string_view kPrefix = "step_", kSuffix = ".safetensors";
  std::error_code missing;
  for (const auto& entry : std::filesystem::directory_iterator(dir, missing)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) continue;
    const std::string_view digits =
        std::string_view(name).substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
    std::int64_t steps = -1;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), steps);
    if (error != std::errc() || end != digits.data() + digits.size()) continue;
    found.emplace_back(steps, entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::filesystem::path> paths;
  for (auto& [steps, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::vector<std::filesystem::path> checkpoints_to_resume(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) {
    fail("checkpoint.load = {}: no such file or directory: give a checkpoint file, the directory that "
         "checkpoint.dir names or the run's out_dir",
         path.string());
  }
  if (!std::filesystem::is_directory(path)) return {path};
  std::vector<std::filesystem::path> found = checkpoints_in(path);
  if (found.empty()) found = checkpoints_in(path / "checkpoints");
  if (found.empty()) {
    fail("checkpoint.load = {}: neither the directory nor its checkpoints/ holds a step_N.safetensors: give a "
         "checkpoint file",
         path.string());
  }
  std::reverse(found.begin(), found.end());
  return found;
}

std::filesystem::path checkpoint_to_resume(const std::filesystem::path& path) {
  const std::vector<std::filesystem::path> candidates = checkpoints_to_resume(path);
  for (const std::filesystem::path& candidate : candidates) {
    try {
      nn::SafetensorsFile::read_metadata(candidate);
      return candidate;
    } catch (const Error&) {
      // the trainer warns about it when it falls back past it
    }
  }
  return candidates.front();  // its load names what is wrong
}

}  // namespace pipeflow::runtime
