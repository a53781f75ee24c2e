#pragma once

#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pipeflow::testing {

// A small XML well-formedness check for the SVG tests: only XML 1.0's
// characters (tab, line feed, carriage return, U+0020 and above less the
// surrogates, U+FFFE and U+FFFF) in UTF-8, written or referenced; one root
// element, balanced and properly nested tags, quoted attributes, no
// duplicate attribute, text and attribute values free of raw '<' and of '&'
// outside the five predefined entities and numeric references. Returns ""
// when the document is well-formed, else what is wrong and where.
class XmlCheck {
 public:
  explicit XmlCheck(std::string_view text) : s_(text) {}

  std::string run() {
    if (!characters()) return error_;
    skip_space();
    if (s_.substr(i_, 5) == "<?xml") {
      const std::size_t end = s_.find("?>", i_);
      if (end == std::string_view::npos) return at("unterminated XML declaration");
      i_ = end + 2;
    }
    int roots = 0;
    while (true) {
      skip_space();
      if (i_ >= s_.size()) break;
      if (s_.substr(i_, 4) == "<!--") {
        if (!comment()) return error_;
        continue;
      }
      if (s_[i_] != '<') return at("text outside the root element");
      if (++roots > 1) return at("a second root element");
      if (!element()) return error_;
    }
    if (roots == 0) return "no root element";
    return "";
  }

  int elements() const { return elements_; }

 private:
  std::string at(const std::string& what) {
    error_ = what + " at offset " + std::to_string(i_);
    return error_;
  }
  bool fail(const std::string& what) {
    at(what);
    return false;
  }
  static bool xml_char(std::uint32_t c) {
    return c == 0x9 || c == 0xA || c == 0xD || (c >= 0x20 && c <= 0xD7FF) || (c >= 0xE000 && c <= 0xFFFD) ||
           (c >= 0x10000 && c <= 0x10FFFF);
  }
  // Every character decoded from UTF-8 (the shortest form) must be XML's.
  bool characters() {
    for (i_ = 0; i_ < s_.size();) {
      const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s_[i_ + k]); };
      const unsigned char lead = byte(0);
      const std::size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
      if (length == 0 || i_ + length > s_.size()) return fail("a byte that is not UTF-8");
      std::uint32_t c = length == 1 ? lead : lead & (0x7F >> length);
      for (std::size_t k = 1; k < length; ++k) {
        if ((byte(k) & 0xC0) != 0x80) return fail("a byte that is not UTF-8");
        c = (c << 6) | (byte(k) & 0x3F);
      }
      const std::uint32_t shortest[] = {0, 0, 0x80, 0x800, 0x10000};
      if (c < shortest[length]) return fail("an overlong UTF-8 form");
      if (!xml_char(c)) return fail("character U+" + hex(c) + ", which XML 1.0 cannot hold");
      i_ += length;
    }
    i_ = 0;
    return true;
  }
  static std::string hex(std::uint32_t c) {
    std::string out;
    for (int shift = c > 0xFFFF ? 20 : 12; shift >= 0; shift -= 4) out += "0123456789ABCDEF"[(c >> shift) & 0xF];
    return out;
  }
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  static bool name_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' || c == '.';
  }
  std::string name() {
    const std::size_t begin = i_;
    while (i_ < s_.size() && name_char(s_[i_])) ++i_;
    return std::string(s_.substr(begin, i_ - begin));
  }
  bool comment() {
    const std::size_t end = s_.find("-->", i_ + 4);
    if (end == std::string_view::npos) return fail("unterminated comment");
    i_ = end + 3;
    return true;
  }
  bool entity() {
    const std::size_t end = s_.find(';', i_);
    if (end == std::string_view::npos) return fail("'&' without ';'");
    const std::string_view ref = s_.substr(i_ + 1, end - i_ - 1);
    const bool named = ref == "amp" || ref == "lt" || ref == "gt" || ref == "quot" || ref == "apos";
    const bool numeric = ref.size() > 1 && ref[0] == '#';
    if (!named && !numeric) return fail("unknown entity &" + std::string(ref) + ";");
    if (numeric) {
      const bool is_hex = ref[1] == 'x';
      const std::string digits(ref.substr(is_hex ? 2 : 1));
      const char* valid = is_hex ? "0123456789abcdefABCDEF" : "0123456789";
      if (digits.empty() || digits.size() > 8 || digits.find_first_not_of(valid) != std::string::npos) {
        return fail("bad character reference &" + std::string(ref) + ";");
      }
      if (!xml_char(static_cast<std::uint32_t>(std::stoul(digits, nullptr, is_hex ? 16 : 10)))) {
        return fail("&" + std::string(ref) + "; refers to a character XML 1.0 cannot hold");
      }
    }
    i_ = end + 1;
    return true;
  }
  bool attributes(bool& self_closing) {
    std::vector<std::string> seen;
    while (true) {
      skip_space();
      if (i_ >= s_.size()) return fail("unterminated tag");
      if (s_[i_] == '>') {
        ++i_;
        return true;
      }
      if (s_.substr(i_, 2) == "/>") {
        i_ += 2;
        self_closing = true;
        return true;
      }
      const std::string attribute = name();
      if (attribute.empty()) return fail("bad attribute name");
      for (const std::string& s : seen) {
        if (s == attribute) return fail("duplicate attribute " + attribute);
      }
      seen.push_back(attribute);
      skip_space();
      if (i_ >= s_.size() || s_[i_] != '=') return fail("attribute " + attribute + " without '='");
      ++i_;
      skip_space();
      if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) return fail("unquoted attribute " + attribute);
      const char quote = s_[i_++];
      while (i_ < s_.size() && s_[i_] != quote) {
        if (s_[i_] == '<') return fail("'<' in attribute " + attribute);
        if (s_[i_] == '&') {
          if (!entity()) return false;
        } else {
          ++i_;
        }
      }
      if (i_ >= s_.size()) return fail("unterminated attribute " + attribute);
      ++i_;
    }
  }
  bool element() {
    ++i_;  // '<'
    const std::string tag = name();
    if (tag.empty()) return fail("bad element name");
    ++elements_;
    bool self_closing = false;
    if (!attributes(self_closing)) return false;
    if (self_closing) return true;
    while (true) {
      if (i_ >= s_.size()) return fail("unclosed <" + tag + ">");
      if (s_.substr(i_, 2) == "</") {
        i_ += 2;
        const std::string closing = name();
        skip_space();
        if (closing != tag) return fail("</" + closing + "> closes <" + tag + ">");
        if (i_ >= s_.size() || s_[i_] != '>') return fail("bad closing tag </" + closing);
        ++i_;
        return true;
      }
      if (s_.substr(i_, 4) == "<!--") {
        if (!comment()) return false;
      } else if (s_[i_] == '<') {
        if (!element()) return false;
      } else if (s_[i_] == '&') {
        if (!entity()) return false;
      } else {
        ++i_;
      }
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
  int elements_ = 0;
  std::string error_;
};

inline std::string xml_problem(std::string_view text) { return XmlCheck(text).run(); }

}  // namespace pipeflow::testing
