#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace pipeflow {

// A JSON configuration object that remembers which keys were asked for, so that
// a key nobody asked for (a typo, a key of another tool) is an error naming its
// full path and the nearest known key.
//
// Read optional keys with get(key, fallback) and mandatory ones with
// require<T>(key); a value of the wrong type is an Error naming the path, the
// value and the expected type. object(key) opens a nested object (an absent one
// reads as empty). When everything is read, call check_no_unknown_keys() once
// on any Config of the tree.
//
// Supported T: bool, int, std::int64_t, double, std::string,
// std::vector<int>, std::vector<double>, std::vector<std::string>.
//
// Thread safety: a Config tree is used from one thread.
class Config {
 public:
  // `source` names the origin in messages (a file name, "--config").
  static Config parse(std::string_view text, std::string source);
  // A file named *.yaml or *.yml is YAML (parse_yaml), any other JSON.
  static Config load(const std::filesystem::path& path);
  static Config from_json(nlohmann::json json, std::string source);

  bool has(std::string_view key) const;
  // Whether `key` holds an object, for keys that take either an object or a
  // plain value; like has(), it counts the key as asked for.
  bool is_object(std::string_view key) const;
  template <class T>
  T get(std::string_view key, const T& fallback) const;
  std::string get(std::string_view key, const char* fallback) const {
    return get<std::string>(key, fallback);
  }
  template <class T>
  T require(std::string_view key) const;

  // The nested object at `key`; absent reads as an empty object.
  Config object(std::string_view key) const;
  // The raw JSON at `key` (null if absent); the key and all below it count as known.
  const nlohmann::json& raw(std::string_view key) const;

  // This object's JSON as given (reading it marks no key as asked for).
  const nlohmann::json& json() const { return *node_; }

  // The origin given to parse/load/from_json, as messages name it.
  const std::string& source() const;

  // "pipeline.stages" for key "stages" of the object at "pipeline".
  std::string path(std::string_view key) const;
  // Throws "<source>: <path> = <value>: <rule>".
  [[noreturn]] void fail_value(std::string_view key, std::string_view rule) const;

  // Throws one Error listing every key that was never asked for.
  void check_no_unknown_keys() const;

  // For formats that carry keys of other tools (a Hugging Face config.json):
  // throws one Error listing every key of this object that is not in `known`
  // but at most kMisspellingDistance edits from one of them, with a "did you
  // mean"; every other key is ignored. Asks for nothing, so it may run
  // before the values are read (a misspelt required key is then reported as
  // a misspelling, not as missing).
  static constexpr std::size_t kMisspellingDistance = 2;
  void check_no_misspelt_keys(const std::vector<std::string>& known) const;

 private:
  struct Tree;
  Config(std::shared_ptr<Tree> tree, const nlohmann::json* node, std::string prefix);
  const nlohmann::json* find(std::string_view key) const;
  [[noreturn]] void fail_type(std::string_view key, const char* expected) const;
  template <class T>
  T convert(std::string_view key, const nlohmann::json& value) const;

  std::shared_ptr<Tree> tree_;
  const nlohmann::json* node_;
  std::string prefix_;
};

}  // namespace pipeflow
