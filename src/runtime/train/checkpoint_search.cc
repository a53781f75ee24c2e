#include "pipeflow/runtime/checkpoint_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/model/hf_config.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/safetensors_index.h"
#include "pipeflow/runtime/stage_partition.h"
#include "pipeflow/runtime/stage_traits.h"

namespace pipeflow::runtime {
namespace {

constexpr std::string_view kPrefix = "step_", kSuffix = ".safetensors";

// N of step_N (a folder) or step_N.safetensors (a file); none for another name.
std::optional<std::int64_t> steps_of(const std::filesystem::path& path, bool folder) {
  const std::string name = path.filename().string();
  const std::string_view suffix = folder ? "" : kSuffix;
  if (!name.starts_with(kPrefix) || !name.ends_with(suffix)) return std::nullopt;
  const std::string_view digits =
      std::string_view(name).substr(kPrefix.size(), name.size() - kPrefix.size() - suffix.size());
  std::int64_t steps = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), steps);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return steps;
}

// std::filesystem's tests that throw on a path they cannot look at (a name
// too long, a loop of links): such a path is neither, and reading it names why.
bool is_folder(const std::filesystem::path& path) {
  std::error_code unreadable;
  return std::filesystem::is_directory(path, unreadable);
}

bool is_there(const std::filesystem::path& path) {
  std::error_code unreadable;
  return std::filesystem::exists(path, unreadable);
}

// The folder of a sharded checkpoint's index file; any other path as it is.
std::filesystem::path without_index(const std::filesystem::path& path) {
  return path.filename() == nn::kSafetensorsIndex ? path.parent_path() : path;
}

bool is_sharded_checkpoint(const std::filesystem::path& dir) {
  return is_there(dir / nn::kSafetensorsIndex) || steps_of(dir, true).has_value();
}

}  // namespace

std::filesystem::path checkpoint_path(const std::filesystem::path& dir, std::int64_t steps_done, bool sharded) {
  return dir / fmt::format("step_{}{}", steps_done, sharded ? "" : kSuffix);
}

std::vector<FoundCheckpoint> checkpoints_in(const std::filesystem::path& dir) {
  std::vector<FoundCheckpoint> found;
  std::error_code missing;
  for (const auto& entry : std::filesystem::directory_iterator(dir, missing)) {
    const auto named = steps_of(entry.path(), entry.is_directory());
    if (!named) continue;
    FoundCheckpoint checkpoint{.path = entry.path(), .named_steps = *named, .steps_done = std::nullopt, .run_id = ""};
    try {
      const nn::SafetensorsFile header = read_checkpoint_metadata(entry.path());
      checkpoint.steps_done = header.metadata_count("steps_done");
      const auto& metadata = header.metadata();
      if (const auto id = metadata.find("run_id"); id != metadata.end()) checkpoint.run_id = id->second;
    } catch (const Error&) {
      // not a checkpoint whose header reads: ranked by its name; its load says what is wrong
    }
    found.push_back(std::move(checkpoint));
  }
  std::sort(found.begin(), found.end(), [](const FoundCheckpoint& a, const FoundCheckpoint& b) {
    return std::tuple(a.steps(), a.steps_done.has_value(), a.path) > std::tuple(b.steps(), b.steps_done.has_value(), b.path);
  });
  return found;
}

std::vector<std::filesystem::path> checkpoints_to_resume(const std::filesystem::path& path) {
  if (!is_there(path)) {
    fail("checkpoint.load = {}: no such file or directory: give a checkpoint file or folder, the directory that "
         "checkpoint.dir names or the run's out_dir",
         quoted_excerpt(path.string()));
  }
  if (!is_folder(path)) {
    return {without_index(path)};
  }
  if (is_sharded_checkpoint(path)) return {path};
  std::vector<FoundCheckpoint> found = checkpoints_in(path);
  if (found.empty()) found = checkpoints_in(path / "checkpoints");
  if (found.empty()) {
    fail("checkpoint.load = {}: neither the directory nor its checkpoints/ holds a step_N.safetensors or a step_N "
         "folder: give a checkpoint",
         path.string());
  }
  std::vector<std::filesystem::path> paths;
  for (FoundCheckpoint& checkpoint : found) paths.push_back(std::move(checkpoint.path));
  return paths;
}

// Hugging Face's own checkpoints carry the model in a config.json beside
// the weights, not in __metadata__: read there, it is written into the
// metadata the way pipeflow's files carry it.
nn::SafetensorsFile with_hf_config(nn::SafetensorsFile file, const std::filesystem::path& checkpoint) {
  if (file.metadata().contains("n_layer")) return file;
  const std::filesystem::path folder = is_folder(checkpoint) ? checkpoint : checkpoint.parent_path();
  const std::filesystem::path config = (folder.empty() ? std::filesystem::path(".") : folder) / "config.json";
  std::error_code unreadable;
  if (!std::filesystem::is_regular_file(config, unreadable)) return file;  // read_config names what is missing
  const nn::ModelConfig model = runtime_model(model_from_hf_config(config), config.string());
  for (auto& [key, value] : nn::config_metadata(model)) file.set_metadata(key, value);
  return file;
}

nn::SafetensorsFile read_checkpoint(const std::filesystem::path& path) {
  const std::filesystem::path checkpoint = without_index(path);
  const bool sharded = is_folder(checkpoint);
  // A folder's shards are checked one by one, so that an error names the shard.
  nn::SafetensorsFile file =
      sharded ? nn::read_sharded(checkpoint, nn::check_values) : nn::SafetensorsFile::read(checkpoint);
  if (!sharded) nn::check_values(file);
  // A vision-language model's has no language model's header: the engine checks its tensors as it reads them.
  if (holds_vision_language_model(file)) return file;
  file = with_hf_config(std::move(file), checkpoint);
  nn::check_tensors_taken(file, nn::read_config(file));
  return file;
}

bool holds_vision_language_model(const nn::SafetensorsFile& file) {
  const auto type = file.metadata().find("model_type");
  return type != file.metadata().end() && type->second == StageTraits<nn::VlmStage>::kModelType;
}

nn::SafetensorsFile read_checkpoint_metadata(const std::filesystem::path& path) {
  const std::filesystem::path checkpoint = without_index(path);
  return with_hf_config(
      is_folder(checkpoint) ? nn::read_sharded_metadata(checkpoint) : nn::SafetensorsFile::read_metadata(checkpoint),
      checkpoint);
}

std::filesystem::path checkpoint_to_resume(const std::filesystem::path& path) {
  const std::vector<std::filesystem::path> candidates = checkpoints_to_resume(path);
  for (const std::filesystem::path& candidate : candidates) {
    try {
      read_checkpoint_metadata(candidate);
      return candidate;
    } catch (const Error&) {
      // the trainer warns about it when it falls back past it
    }
  }
  return candidates.front();  // its load names what is wrong
}

}  // namespace pipeflow::runtime
