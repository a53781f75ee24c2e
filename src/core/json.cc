#include "pipeflow/core/json.h"

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

// Appends `value` to `out` until `out` passes `limit`. Every level appends a
// bracket before going deeper, so the recursion ends within `limit` levels.
void append_until(const nlohmann::json& value, std::string& out, std::size_t limit) {
  if (out.size() > limit) return;
  if (!value.is_structured()) {
    out += value.dump();
    return;
  }
  const bool object = value.is_object();
  out += object ? '{' : '[';
  bool first = true;
  for (const auto& [key, element] : value.items()) {
    if (out.size() > limit) return;
    if (!first) out += ',';
    first = false;
    if (object) out += nlohmann::json(key).dump() + ':';
    append_until(element, out, limit);
  }
  out += object ? '}' : ']';
}

struct TooDeep {};

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  // The callback sees the depth before an array or object opens: 0 for the outermost.
  const auto limit_depth = [](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    using Event = nlohmann::json::parse_event_t;
    // nlohmann keeps parsing after a callback discards a value; an exception stops it at once.
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  try {
    return nlohmann::json::parse(text, limit_depth);
  } catch (const TooDeep&) {
    // reported below
  } catch (const nlohmann::json::exception& error) {  // parse_error, or out_of_range for a number like 1e400
    fail("{}: not valid JSON: {}", source, error.what());
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

std::string quoted_excerpt(std::string_view text, std::size_t max_chars) {
  std::string out = "\"";
  const std::string_view shown = text.substr(0, max_chars);
  for (const char c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '"' && c != '\\') {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  out += '"';
  if (shown.size() < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

}  // namespace pipeflow
