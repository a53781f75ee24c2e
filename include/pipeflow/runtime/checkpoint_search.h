#pragma once

#include <filesystem>
#include <vector>

namespace pipeflow::runtime {

// The checkpoints to resume from (checkpoint.load, --resume), newest first:
// `path` itself when it is a file; else the step_N.safetensors of the
// directory by N descending, or, when it holds none, those of its
// checkpoints/ folder (a run's out_dir). The trainer takes the first that
// loads. Throws Error saying what to give instead when there is none.
std::vector<std::filesystem::path> checkpoints_to_resume(const std::filesystem::path& path);

// The newest of checkpoints_to_resume(path) whose header reads (it gives the
// model's shape), or the newest when none does.
std::filesystem::path checkpoint_to_resume(const std::filesystem::path& path);

// The step_N.safetensors in `dir`, by N ascending (none when `dir` is missing).
std::vector<std::filesystem::path> checkpoints_in(const std::filesystem::path& dir);

}  // namespace pipeflow::runtime
