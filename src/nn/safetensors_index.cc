#include "pipeflow/nn/safetensors_index.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <map>
#include <regex>
#include <set>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"

namespace pipeflow::nn {
namespace {

// The index of `folder`: tensor name -> shard file, checked.
std::map<std::string, std::string> read_weight_map(const std::filesystem::path& folder) {
  const std::filesystem::path index = folder / kSafetensorsIndex;
  std::error_code unreadable;  // a name too long, a loop of links: no index either
  if (!std::filesystem::exists(index, unreadable)) {
    fail("{}: no {}: the checkpoint is incomplete (its index is written last, after every shard: a writer stopped "
         "before it); resume from another checkpoint",
         folder.string(), kSafetensorsIndex);
  }
  const nlohmann::json json =
      parse_json(read_file(index, kMaxConfigFileBytes, "safetensors index"), index.string());
  if (!json.is_object() || !json.contains("weight_map") || !json["weight_map"].is_object()) {
    fail("{}: needs an object \"weight_map\" of tensor name -> shard file", index.string());
  }
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : json["weight_map"].items()) {
    if (!file.is_string()) fail("{}: weight_map.{} must be a file name, got {}", index.string(), name, short_dump(file));
    const std::string text = file.get<std::string>();
    if (text.empty() || std::filesystem::path(text).filename() != text || text == "." || text == "..") {
      fail("{}: weight_map.{} = \"{}\" must name a file of the folder (no directories)", index.string(), name, text);
    }
    map[name] = text;
  }
  if (map.empty()) fail("{}: weight_map names no tensor", index.string());
  return map;
}

}  // namespace

std::string shard_file_name(int shard, int shards) {
  return fmt::format("model-{:05}-of-{:05}.safetensors", shard + 1, shards);
}

bool is_shard_file_name(std::string_view name) {
  static const std::regex pattern(R"(model-[0-9]{5,}-of-[0-9]{5,}\.safetensors)");
  return std::regex_match(name.begin(), name.end(), pattern);
}

void write_safetensors_index(const std::filesystem::path& folder, const std::vector<ShardContents>& shards) {
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  std::uint64_t total = 0;
  for (const ShardContents& shard : shards) {
    for (const std::string& name : shard.names) {
      if (map.contains(name)) {
        fail("internal: tensor {} in shards {} and {}", name, map[name].get<std::string>(), shard.file);
      }
      map[name] = shard.file;
    }
    total += shard.bytes;
  }
  const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  write_file_atomic(folder / kSafetensorsIndex, json_text(index, 2) + "\n");
}

SafetensorsFile read_sharded(const std::filesystem::path& folder,
                             const std::function<void(const SafetensorsFile&)>& check) {
  const std::map<std::string, std::string> map = read_weight_map(folder);
  const std::string index = (folder / kSafetensorsIndex).string();
  std::map<std::string, std::size_t> part_of_file;  // shard file -> its place in parts
  for (const auto& [name, file] : map) part_of_file.emplace(file, 0);
  std::vector<SafetensorsFile> parts;
  for (auto& [file, part] : part_of_file) {
    part = parts.size();
    parts.push_back(SafetensorsFile::read(folder / file));
    if (check) check(parts.back());
    for (const std::string& name : parts.back().names()) {
      const auto mapped = map.find(name);
      if (mapped == map.end()) {
        fail("{}: holds tensor {}, which {} does not name: the shard does not belong to this index",
             parts.back().source(), name, index);
      }
      if (mapped->second != file) {
        fail("{}: holds tensor {}, which {} maps to {}: the shard does not belong to this index",
             parts.back().source(), name, index, mapped->second);
      }
    }
  }
  for (const auto& [name, file] : map) {
    const SafetensorsFile& part = parts[part_of_file.at(file)];
    if (!part.contains(name)) fail("{}: maps tensor {} to {}, which does not hold it", index, name, part.source());
  }
  return SafetensorsFile::merge(parts, index);
}

SafetensorsFile read_sharded_metadata(const std::filesystem::path& folder) {
  const std::map<std::string, std::string> map = read_weight_map(folder);
  std::set<std::string> files;
  for (const auto& [name, file] : map) files.insert(file);
  return SafetensorsFile::read_metadata(folder / *files.begin());
}

}  // namespace pipeflow::nn
