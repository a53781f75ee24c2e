#include "pipeflow/core/config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"

namespace pipeflow {

struct Config::Tree {
  nlohmann::json root;
  std::string source;
  std::set<std::string> asked;   // full paths of keys read (present or not)
  std::set<std::string> opened;  // full paths of objects opened with object()
  std::set<std::string> whole;   // full paths taken with raw(): all below is known
};

namespace {

const nlohmann::json kNull = nullptr;
const nlohmann::json kEmptyObject = nlohmann::json::object();

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

struct Closest {
  std::string key;  // empty: no candidate
  std::size_t distance = std::numeric_limits<std::size_t>::max();
};

// The candidate (among those `keep` accepts) fewest edits from `key`.
template <class Keys, class Keep>
Closest closest_key(std::string_view key, const Keys& candidates, Keep keep) {
  Closest best;
  for (const std::string& candidate : candidates) {
    if (!keep(candidate)) continue;
    const std::size_t distance = edit_distance(candidate, key);
    if (distance < best.distance) best = {candidate, distance};
  }
  return best;
}

std::string parent_of(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

}  // namespace

Config::Config(std::shared_ptr<Tree> tree, const nlohmann::json* node, std::string prefix)
    : tree_(std::move(tree)), node_(node), prefix_(std::move(prefix)) {}

Config Config::from_json(nlohmann::json json, std::string source) {
  if (!json.is_object()) fail("{}: a configuration must be a JSON object, got {}", source, short_dump(json));
  auto tree = std::make_shared<Tree>();
  tree->root = std::move(json);
  tree->source = std::move(source);
  tree->opened.insert("");
  const nlohmann::json* root = &tree->root;
  return Config(std::move(tree), root, "");
}

Config Config::parse(std::string_view text, std::string source) {
  nlohmann::json json = parse_json(text, source);
  return from_json(std::move(json), std::move(source));
}

Config Config::load(const std::filesystem::path& path) {
  const std::string text = read_file(path, kMaxConfigFileBytes, "configuration file");
  const std::string extension = path.extension().string();
  if (extension == ".yaml" || extension == ".yml") return from_json(parse_yaml(text, path.string()), path.string());
  return parse(text, path.string());
}

const std::string& Config::source() const { return tree_->source; }

std::string Config::path(std::string_view key) const {
  return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
}

const nlohmann::json* Config::find(std::string_view key) const {
  tree_->asked.insert(path(key));
  const auto it = node_->find(std::string(key));
  return it == node_->end() ? nullptr : &*it;
}

bool Config::has(std::string_view key) const { return find(key) != nullptr; }

bool Config::is_object(std::string_view key) const {
  const nlohmann::json* value = find(key);
  return value != nullptr && value->is_object();
}

Config Config::object(std::string_view key) const {
  const nlohmann::json* value = find(key);
  tree_->opened.insert(path(key));
  if (value == nullptr) return Config(tree_, &kEmptyObject, path(key));
  if (!value->is_object()) fail_type(key, "an object");
  return Config(tree_, value, path(key));
}

const nlohmann::json& Config::raw(std::string_view key) const {
  const nlohmann::json* value = find(key);
  tree_->whole.insert(path(key));
  return value == nullptr ? kNull : *value;
}

void Config::fail_type(std::string_view key, const char* expected) const {
  fail("{}: {} must be {}, got {}", tree_->source, path(key), expected, short_dump(*find(key)));
}

void Config::fail_value(std::string_view key, std::string_view rule) const {
  const nlohmann::json* value = find(key);
  fail("{}: {} = {}: {}", tree_->source, path(key), value ? short_dump(*value) : "(absent)", rule);
}

template <class T>
T Config::convert(std::string_view key, const nlohmann::json& value) const {
  if constexpr (std::is_same_v<T, bool>) {
    if (!value.is_boolean()) fail_type(key, "true or false");
    return value.get<bool>();
  } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, std::int64_t>) {
    const bool integral = value.is_number_integer() ||
                          (value.is_number_float() && std::nearbyint(value.get<double>()) == value.get<double>());
    if (!integral) fail_type(key, "an integer");
    const double number = value.get<double>();
    if (number < static_cast<double>(std::numeric_limits<T>::min()) ||
        number > static_cast<double>(std::numeric_limits<T>::max())) {
      fail_type(key, "an integer in range");
    }
    return value.is_number_integer() ? value.get<T>() : static_cast<T>(number);
  } else if constexpr (std::is_same_v<T, double>) {
    if (!value.is_number()) fail_type(key, "a number");
    return value.get<double>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!value.is_string()) fail_type(key, "a string");
    return value.get<std::string>();
  } else {
    using Element = typename T::value_type;
    if (!value.is_array()) fail_type(key, "a list");
    T result;
    for (const auto& element : value) {
      // Elements are checked with the element type's rule but reported at the list's path.
      result.push_back(convert<Element>(key, element));
    }
    return result;
  }
}

template <class T>
T Config::get(std::string_view key, const T& fallback) const {
  const nlohmann::json* value = find(key);
  return value == nullptr || value->is_null() ? fallback : convert<T>(key, *value);
}

template <class T>
T Config::require(std::string_view key) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr || value->is_null()) {
    fail("{}: {} is required but missing", tree_->source, path(key));
  }
  return convert<T>(key, *value);
}

#define PIPEFLOW_CONFIG_INSTANTIATE(T)                                  \
  template T Config::get<T>(std::string_view, const T&) const;          \
  template T Config::require<T>(std::string_view) const;
PIPEFLOW_CONFIG_INSTANTIATE(bool)
PIPEFLOW_CONFIG_INSTANTIATE(int)
PIPEFLOW_CONFIG_INSTANTIATE(std::int64_t)
PIPEFLOW_CONFIG_INSTANTIATE(double)
PIPEFLOW_CONFIG_INSTANTIATE(std::string)
PIPEFLOW_CONFIG_INSTANTIATE(std::vector<int>)
PIPEFLOW_CONFIG_INSTANTIATE(std::vector<double>)
PIPEFLOW_CONFIG_INSTANTIATE(std::vector<std::string>)
#undef PIPEFLOW_CONFIG_INSTANTIATE

void Config::check_no_unknown_keys() const {
  std::vector<std::string> unknown;
  // Walk the objects that were opened; a key at such a level must have been asked for.
  std::vector<std::pair<std::string, const nlohmann::json*>> pending = {{"", &tree_->root}};
  while (!pending.empty()) {
    auto [prefix, node] = pending.back();
    pending.pop_back();
    for (const auto& [key, value] : node->items()) {
      const std::string full = prefix.empty() ? key : prefix + "." + key;
      if (tree_->whole.count(full)) continue;
      if (!tree_->asked.count(full)) {
        unknown.push_back(full);
      } else if (value.is_object() && tree_->opened.count(full)) {
        pending.emplace_back(full, &value);
      }
    }
  }
  if (unknown.empty()) return;
  std::sort(unknown.begin(), unknown.end());

  std::string message = fmt::format("{}: unknown key{}", tree_->source, unknown.size() > 1 ? "s" : "");
  for (const std::string& key : unknown) {
    message += fmt::format("{} '{}'", &key == &unknown.front() ? "" : ",", key);
    const Closest best =
        closest_key(key, tree_->asked, [&](const std::string& known) { return parent_of(known) == parent_of(key); });
    if (!best.key.empty() && best.distance <= std::max<std::size_t>(2, key.size() / 3)) {
      message += fmt::format(" (did you mean '{}'?)", best.key);
    }
  }
  message += ": remove it or fix its spelling";
  fail("{}", message);
}

void Config::check_no_misspelt_keys(const std::vector<std::string>& known) const {
  std::vector<std::string> misspelt;
  for (const auto& [key, value] : node_->items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    const Closest best = closest_key(key, known, [](const std::string&) { return true; });
    // Tighter than check_no_unknown_keys()'s max(2, |key|/3): the keys of
    // other tools are not typos, and some lie 3 edits from a known key
    // (rope_type and model_type).
    if (best.distance <= kMisspellingDistance) {
      misspelt.push_back(fmt::format("'{}' (did you mean '{}'?)", path(key), path(best.key)));
    }
  }
  if (misspelt.empty()) return;
  std::string message = fmt::format("{}: unknown key{}", tree_->source, misspelt.size() > 1 ? "s" : "");
  for (const std::string& item : misspelt) message += (&item == &misspelt.front() ? " " : ", ") + item;
  fail("{}: fix {} spelling (other unknown keys are ignored, but a misspelt known key would silently take its "
       "default)",
       message, misspelt.size() > 1 ? "their" : "its");
}

}  // namespace pipeflow
