#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pipeflow/nn/safetensors.h"

namespace pipeflow::runtime {

// A training checkpoint (PipelineEngine::write_checkpoint) is one of
//   DIR/step_N.safetensors  one file (written in one process), or
//   DIR/step_N/             a folder of shards, one per pipeline rank, and
//                           model.safetensors.index.json (nn/safetensors_index.h),
//                           written last (written under MPI);
// N: the steps done. Both hold the whole model by tensor name.
std::filesystem::path checkpoint_path(const std::filesystem::path& dir, std::int64_t steps_done, bool sharded);

// The checkpoints to resume from (checkpoint.load, --resume), newest first:
// `path` itself when it is a checkpoint file or folder (a folder holding the
// index or named step_N; the index file stands for its folder); else the
// checkpoints of the directory (checkpoints_in's order), or, when it holds none,
// those of its checkpoints/ folder (a run's out_dir). The trainer takes the
// first that loads. Throws Error saying what to give instead when there is
// none.
std::vector<std::filesystem::path> checkpoints_to_resume(const std::filesystem::path& path);

// A checkpoint (file or folder) read whole, every check of its format made
// (nn::read_sharded for a folder: an incomplete one without its index is an
// Error naming the folder), every value checked (nn::check_values: a
// non-finite value is an Error naming the file, or the shard, and the
// tensor) and every tensor named as a parameter taken by the model it
// describes (nn::check_tensors_taken); its header's __metadata__ alone. The index
// file stands for its folder. read_checkpoint is also how generate and grad
// read --weights: a weights file, or a checkpoint in either form, or a
// Hugging Face checkpoint as published (BF16, F16 or F32 tensors, sharded or
// not, without pipeflow's metadata): its config.json, in the same folder,
// gives the model (written into the metadata as pipeflow's files hold it).
nn::SafetensorsFile read_checkpoint(const std::filesystem::path& checkpoint);
nn::SafetensorsFile read_checkpoint_metadata(const std::filesystem::path& checkpoint);

// Whether a file's header says it holds the vision-language model's tensors
// (StageTraits<nn::VlmStage>::kModelType): read_checkpoint then checks no
// language model's header and tensors, and it gives no model's shape.
bool holds_vision_language_model(const nn::SafetensorsFile& file);

// The newest of checkpoints_to_resume(path) whose header reads (it gives the
// model's shape), or the newest when none does.
std::filesystem::path checkpoint_to_resume(const std::filesystem::path& path);

// A step_N file or folder of a directory, with what its header says.
struct FoundCheckpoint {
  std::filesystem::path path;
  std::int64_t named_steps = 0;            // N of its name
  std::optional<std::int64_t> steps_done;  // its __metadata__'s; none when its header does not read
  std::string run_id;                      // its __metadata__'s run_id ("": none, or no header)
  // The steps it holds: its header's, else its name's.
  std::int64_t steps() const { return steps_done.value_or(named_steps); }
};

// The checkpoints (step_N files and folders) in `dir`, newest first: by the
// steps their headers hold (a renamed step_0009 holding 3 steps ranks as 3),
// those whose header does not read by their name's N after the readable ones
// of the same steps. None when `dir` is missing.
std::vector<FoundCheckpoint> checkpoints_in(const std::filesystem::path& dir);

}  // namespace pipeflow::runtime
