#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace pipeflow {

// This header declares with <nlohmann/json_fwd.hpp> alone, as every public
// header of pipeflow does: a file that builds, reads or dumps a json value
// includes <nlohmann/json.hpp> itself (about 3 s of compile time a file).
//
// Every JSON text pipeflow reads (configurations, Hugging Face config.json,
// schedule files, hardware profiles, measured profiles, Chrome traces,
// safetensors headers) goes through parse_json, so that hostile input meets
// one set of rules.
//
// Arrays and objects nest at most kMaxJsonDepth levels: nlohmann's parser
// and dump() recurse once per level, so 100 000 nested '[' overflow the
// stack; pipeflow's own files nest a few levels.
inline constexpr int kMaxJsonDepth = 64;

// Throws Error "<source>: not valid JSON: ..." (the line and column, and of
// the text there at most a quoted_excerpt) or "<source>: JSON nested deeper
// than 64 levels ...".
nlohmann::json parse_json(std::string_view text, const std::string& source);

// A YAML document (a configuration written in YAML) as JSON, by YAML 1.2's
// core schema: a plain scalar is a boolean (true, false), null (null, ~,
// empty), an integer or a number where it reads as one, else a string; a
// quoted scalar is always a string. The same limits as parse_json: nesting
// at most kMaxJsonDepth levels, and at most kMaxYamlNodes nodes once aliases
// are expanded (a few anchors can otherwise stand for billions of nodes).
// Throws Error "<source>: not valid YAML: ... (line L, column C)".
inline constexpr std::size_t kMaxYamlNodes = std::size_t{1} << 20;
nlohmann::json parse_yaml(std::string_view text, const std::string& source);

// `value` as JSON text, as every file and line pipeflow writes it: a string
// that is not UTF-8 (a path's or an argument's bytes), which JSON cannot
// hold and nlohmann's dump() throws on, has each byte that is not UTF-8
// written as U+FFFD. `indent` as dump()'s (-1: one line). For json and
// ordered_json.
template <class Json>
std::string json_text(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// `value` as compact JSON for an error message: at most kShortDumpChars
// characters (longer ones end in "..."), built without dumping the whole
// value, so a huge or deeply nested value costs no more than a short one.
inline constexpr std::size_t kShortDumpChars = 60;
std::string short_dump(const nlohmann::json& value);

// A user's value (a flag's or a key's, a name, a path, a token or a cell
// of a file) quoted for an error message, however long or binary it is: at
// most `max_bytes` bytes of it (then "... (N bytes)"), a control character,
// '"', '\\' and a byte that is not UTF-8 written as \xNN. Every message
// quotes such a value through it, so that a 5 MB value makes a line.
inline constexpr std::size_t kQuotedExcerptBytes = 200;
std::string quoted_excerpt(std::string_view text, std::size_t max_bytes = kQuotedExcerptBytes);

}  // namespace pipeflow
