#pragma once

#include <filesystem>

namespace pipeflow::runtime {

// The checkpoint to resume from (checkpoint.load, --resume): `path` itself
// when it is a file, else the step_N.safetensors with the highest N in the
// directory. Throws Error saying what to give instead when there is none.
std::filesystem::path checkpoint_to_resume(const std::filesystem::path& path);

}  // namespace pipeflow::runtime
