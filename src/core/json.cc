#include "pipeflow/core/json.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "pipeflow/core/error.h"
#include "pipeflow/core/text.h"

namespace pipeflow {
namespace {

// Appends `value` to `out` until `out` passes `limit`. Every level appends a
// bracket before going deeper, so the recursion ends within `limit` levels.
void append_until(const nlohmann::json& value, std::string& out, std::size_t limit) {
  if (out.size() > limit) return;
  if (!value.is_structured()) {
    out += json_text(value);
    return;
  }
  const bool object = value.is_object();
  out += object ? '{' : '[';
  bool first = true;
  for (const auto& [key, element] : value.items()) {
    if (out.size() > limit) return;
    if (!first) out += ',';
    first = false;
    if (object) out += json_text(nlohmann::json(key)) + ':';
    append_until(element, out, limit);
  }
  out += object ? '}' : ']';
}

// nlohmann's message quotes the token it stopped at whole ("...; last read:
// '<token>'", "number overflow parsing '<token>'"): a 5 MB string, or the
// first line of a file that is no JSON at all. The message keeps its place
// (line and column) and description; the token becomes a short excerpt.
std::string without_whole_token(std::string_view message) {
  if (const std::size_t tag = message.find("] "); message.starts_with("[json.exception.") && tag != message.npos) {
    message.remove_prefix(tag + 2);
  }
  for (const std::string_view marker : {"last read: '", "parsing '"}) {
    const std::size_t at = message.find(marker);
    if (at == message.npos) continue;
    const std::size_t begin = at + marker.size();
    // A syntax error's "; expected <what>" follows the token; <what> names a token kind.
    std::size_t end = message.rfind("'; expected ");
    if (end == message.npos || end < begin) end = message.rfind('\'');
    if (end == message.npos || end < begin) end = message.size();
    return fmt::format("{}{}{}", message.substr(0, at + marker.size() - 1),
                       quoted_excerpt(message.substr(begin, end - begin), kShortDumpChars),
                       message.substr(std::min(end + 1, message.size())));
  }
  return std::string(message);
}

struct TooDeep {};

// A key given twice in one object, with the first value's text.
struct DuplicateKey {
  std::string path;
  std::string first;
};

// Builds the document as nlohmann's SAX parser reads it, in one pass:
// objects and arrays nest at most kMaxJsonDepth levels, and a key repeated
// within an object is refused (nlohmann would keep the last silently).
class Builder : public nlohmann::json_sax<nlohmann::json> {
 public:
  nlohmann::json result;

  bool null() override { return put(nullptr); }
  bool boolean(bool value) override { return put(value); }
  bool number_integer(number_integer_t value) override { return put(value); }
  bool number_unsigned(number_unsigned_t value) override { return put(value); }
  bool number_float(number_float_t value, const string_t&) override { return put(value); }
  bool string(string_t& value) override { return put(std::move(value)); }
  bool binary(binary_t& value) override { return put(nlohmann::json::binary(std::move(value))); }
  bool start_object(std::size_t) override { return open(nlohmann::json::object()); }
  bool start_array(std::size_t) override { return open(nlohmann::json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& name) override {
    const nlohmann::json& object = *stack_.back();
    const auto found = object.find(name);
    if (found != object.end()) throw DuplicateKey{path_of(name), short_dump(*found)};
    key_ = std::move(name);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& error) override {
    throw error;
  }

 private:
  // Where the next value goes: the root, an array's end, or an object's key.
  nlohmann::json* place(nlohmann::json value) {
    if (stack_.empty()) {
      result = std::move(value);
      return &result;
    }
    nlohmann::json& parent = *stack_.back();
    keys_.back() = key_;
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    nlohmann::json& slot = parent[key_];
    slot = std::move(value);
    return &slot;
  }
  bool put(nlohmann::json value) {
    place(std::move(value));
    return true;
  }
  bool open(nlohmann::json container) {
    if (static_cast<int>(stack_.size()) >= kMaxJsonDepth) throw TooDeep{};
    nlohmann::json* at = place(std::move(container));
    stack_.push_back(at);
    keys_.emplace_back();
    return true;
  }
  bool close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  // "a.b.name": the keys of the enclosing objects, array positions as [i].
  std::string path_of(const std::string& name) const {
    std::string path;
    for (std::size_t level = 0; level + 1 < stack_.size(); ++level) {
      const nlohmann::json& container = *stack_[level];
      if (container.is_array()) {
        path += fmt::format("[{}]", container.size() - 1);
      } else {
        path += (path.empty() ? "" : ".") + keys_[level];
      }
    }
    return path.empty() ? name : path + "." + name;
  }

  std::vector<nlohmann::json*> stack_;
  std::vector<std::string> keys_;  // per open container: the key its newest value went under
  std::string key_;
};

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  Builder builder;
  try {
    nlohmann::json::sax_parse(text, &builder);
    return std::move(builder.result);
  } catch (const TooDeep&) {
    // reported below
  } catch (const DuplicateKey& duplicate) {
    fail("{}: key {} appears twice in one object (first {}): JSON keys must be unique; keep the one you mean",
         source, duplicate.path, duplicate.first);
  } catch (const nlohmann::json::exception& error) {  // parse_error, or out_of_range for a number like 1e400
    fail("{}: not valid JSON: {}", source, without_whole_token(error.what()));
  }
  fail("{}: JSON nested deeper than the limit of {} levels (arrays and objects within each other), far more than any "
       "configuration, schedule, profile or trace needs: is it the right file?",
       source, kMaxJsonDepth);
}

std::string short_dump(const nlohmann::json& value) {
  std::string text;
  append_until(value, text, kShortDumpChars);
  if (text.size() > kShortDumpChars) text = text.substr(0, kShortDumpChars - 3) + "...";
  return text;
}

std::string quoted_excerpt(std::string_view text, std::size_t max_bytes) {
  std::string out = "\"";
  const std::string_view shown = text.substr(0, max_bytes);
  for (std::size_t i = 0; i < shown.size();) {
    const auto byte = static_cast<unsigned char>(shown[i]);
    const std::size_t length = utf8_sequence_length(shown, i);
    // Printable ASCII but the quote and the backslash, and UTF-8 past the C1 controls (U+0080..U+009F).
    const bool as_is = length == 1 ? byte >= 0x20 && byte < 0x7f && byte != '"' && byte != '\\'
                                   : length > 1 && !(byte == 0xC2 && static_cast<unsigned char>(shown[i + 1]) < 0xA0);
    if (as_is) {
      out += shown.substr(i, length);
      i += length;
    } else {
      out += fmt::format("\\x{:02x}", byte);
      ++i;
    }
  }
  out += '"';
  if (shown.size() < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

namespace {

// A plain YAML scalar by the core schema.
nlohmann::json plain_scalar(const std::string& text) {
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") return nullptr;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (*begin == '+') ++begin;
  std::int64_t integer = 0;
  if (auto [at, error] = std::from_chars(begin, end, integer); error == std::errc() && at == end) return integer;
  double number = 0;
  if (auto [at, error] = std::from_chars(begin, end, number); error == std::errc() && at == end && std::isfinite(number)) {
    return number;
  }
  return text;
}

const std::string& utf8(const std::string& text, const std::string& source) {
  if (!is_utf8(text)) fail("{}: a YAML string that is not UTF-8: write the file in UTF-8", source);
  return text;
}

struct YamlLimits {
  std::size_t nodes = 0;
  const std::string& source;
};

nlohmann::json to_json(const YAML::Node& node, int depth, YamlLimits& limits) {
  if (++limits.nodes > kMaxYamlNodes) {
    fail("{}: more than {} YAML nodes (aliases expanded): is it a configuration?", limits.source, kMaxYamlNodes);
  }
  if (depth > kMaxJsonDepth) fail("{}: YAML nested deeper than {} levels", limits.source, kMaxJsonDepth);
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      return node.Tag() == "!" ? nlohmann::json(utf8(node.Scalar(), limits.source))
                               : plain_scalar(utf8(node.Scalar(), limits.source));
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (const YAML::Node& element : node) out.push_back(to_json(element, depth + 1, limits));
      return out;
    }
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) fail("{}: a YAML key that is not a plain name", limits.source);
        const std::string key = utf8(entry.first.Scalar(), limits.source);
        if (out.contains(key)) fail("{}: key '{}' given twice in one YAML mapping", limits.source, key);
        out[key] = to_json(entry.second, depth + 1, limits);
      }
      return out;
    }
  }
  return nullptr;
}

}  // namespace

nlohmann::json parse_yaml(std::string_view text, const std::string& source) {
  // yaml-cpp's parser recurses once per level of flow brackets: bound them before it reads.
  int depth = 0;
  for (const char c : text) {
    if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) fail("{}: YAML nested deeper than {} levels", source, kMaxJsonDepth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    YamlLimits limits{0, source};
    return to_json(root, 0, limits);
  } catch (const YAML::Exception& error) {
    fail("{}: not valid YAML: {} (line {}, column {})", source, error.msg, error.mark.line + 1, error.mark.column + 1);
  }
}

}  // namespace pipeflow
