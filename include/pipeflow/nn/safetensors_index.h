#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/nn/safetensors.h"

namespace pipeflow::nn {

// Hugging Face's sharded safetensors: a folder of shard files
// model-00001-of-00004.safetensors … model-00004-of-00004.safetensors and
//   model.safetensors.index.json
//   {"metadata": {"total_size": <bytes of every tensor>},
//    "weight_map": {"<tensor name>": "<shard file>", ...}}
// naming each tensor's shard. The index is written last: a folder without
// it is an incomplete write.
inline constexpr std::string_view kSafetensorsIndex = "model.safetensors.index.json";

// The name of shard `shard` (from 0) of `shards`: model-0000{shard+1}-of-0000{shards}.safetensors.
std::string shard_file_name(int shard, int shards);
// Whether `name` has that form (any shard of any count).
bool is_shard_file_name(std::string_view name);

// One shard as the index lists it.
struct ShardContents {
  std::string file;                // a file name in the folder
  std::vector<std::string> names;  // its tensors
  std::uint64_t bytes = 0;         // their data bytes
};

// Writes `folder`/model.safetensors.index.json atomically (core/file.h).
// Error when two shards name the same tensor.
void write_safetensors_index(const std::filesystem::path& folder, const std::vector<ShardContents>& shards);

// Reads the index of `folder` and every shard it names (each checked as
// SafetensorsFile::read checks it, CRC32s included: errors name the shard
// file and the tensor), and returns them merged into one file named after
// the index. Error naming the folder when it has no index (an incomplete
// checkpoint), and naming the file when the index names a shard file that is
// not a plain file name of the folder, a tensor its shard lacks, or a shard
// holds a tensor the index maps elsewhere. `check`, if given, sees each shard
// before the merge (its errors then name the shard file).
SafetensorsFile read_sharded(const std::filesystem::path& folder,
                             const std::function<void(const SafetensorsFile&)>& check = {});
// The __metadata__ of the first shard the index names (no tensors): what
// SafetensorsFile::read_metadata gives for one file.
SafetensorsFile read_sharded_metadata(const std::filesystem::path& folder);

}  // namespace pipeflow::nn
