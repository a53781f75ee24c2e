#pragma once

#include <cctype>
#include <cstddef>
#include <string_view>

namespace pipeflow {

// `text` without the white space (spaces, tabs, line ends) at either end.
inline std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

// The bytes of the UTF-8 sequence that starts at text[at] (at < text.size()),
// as RFC 3629 defines it: no overlong forms, no surrogates, nothing past
// U+10FFFF; 0 when the bytes there are not one.
std::size_t utf8_sequence_length(std::string_view text, std::size_t at);

// Whether all of `text` is UTF-8 (JSON's strings are; a file name, a YAML
// string or a command-line argument may be any bytes).
bool is_utf8(std::string_view text);

}  // namespace pipeflow
