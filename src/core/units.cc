#include "pipeflow/core/units.h"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <cmath>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

std::string three_digits(double value) {
  const double magnitude = std::fabs(value);
  if (magnitude >= 100.0 || magnitude == 0.0) return fmt::format("{:.0f}", value);
  if (magnitude >= 10.0) return fmt::format("{:.1f}", value);
  return fmt::format("{:.2f}", value);
}

}  // namespace

std::string format_bytes(double bytes) {
  static constexpr std::array<const char*, 6> kUnits = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  std::size_t unit = 0;
  while (std::fabs(bytes) >= 1024.0 && unit + 1 < kUnits.size()) {
    bytes /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{:.0f} B", bytes);
  return three_digits(bytes) + " " + kUnits[unit];
}

std::string format_seconds(double seconds) {
  const double magnitude = std::fabs(seconds);
  if (magnitude == 0.0) return "0 s";
  if (magnitude < 1e-6) return three_digits(seconds * 1e9) + " ns";
  if (magnitude < 1e-3) return three_digits(seconds * 1e6) + " us";
  if (magnitude < 1.0) return three_digits(seconds * 1e3) + " ms";
  if (magnitude < 600.0) return three_digits(seconds) + " s";
  if (magnitude < 3 * 3600.0) return three_digits(seconds / 60.0) + " min";
  return three_digits(seconds / 3600.0) + " h";
}

std::string format_si(double value, const std::string& unit) {
  static constexpr std::array<const char*, 7> kPrefixes = {"", "k", "M", "G", "T", "P", "E"};
  std::size_t prefix = 0;
  while (std::fabs(value) >= 1000.0 && prefix + 1 < kPrefixes.size()) {
    value /= 1000.0;
    ++prefix;
  }
  return three_digits(value) + " " + kPrefixes[prefix] + unit;
}

std::string format_percent(double fraction) { return fmt::format("{:.1f}%", 100.0 * fraction); }

std::string format_count(std::int64_t count, const std::string& singular, const std::string& plural) {
  if (count == 1) return fmt::format("1 {}", singular);
  return fmt::format("{} {}", count, plural.empty() ? singular + "s" : plural);
}

std::string format_parameters(double count) {
  if (count >= 1e9) return fmt::format("{:.2f}B", count / 1e9);
  if (count >= 1e6) return fmt::format("{:.1f}M", count / 1e6);
  if (count >= 1e3) return fmt::format("{:.1f}K", count / 1e3);
  return fmt::format("{:.0f}", count);
}

std::int64_t parse_byte_size(std::string_view text, std::string_view option) {
  constexpr std::int64_t kLargest = std::int64_t{1} << 62;
  const auto bad = [&](std::string_view rule) {
    fail("{} {}: {}; write a whole number of bytes with an optional K, M or G (powers of 1024), e.g. 4096, 1K "
         "or 64M",
         option, quoted_excerpt(text), rule);
  };
  std::size_t digits = 0;
  std::int64_t number = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])) != 0) {
    if (number > kLargest / 10) bad("too large");
    number = number * 10 + (text[digits] - '0');
    ++digits;
  }
  if (digits == 0) bad("not a byte count");
  std::string suffix(text.substr(digits));
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!suffix.empty() && suffix != "B") {
    const std::string_view units = "KMG";
    const std::size_t unit = units.find(suffix.front());
    if (unit == std::string_view::npos || (suffix.size() > 1 && suffix.substr(1) != "B" && suffix.substr(1) != "IB")) {
      bad("unknown unit");
    }
    shift = 10 * static_cast<int>(unit + 1);
  }
  if (number > (kLargest >> shift)) bad("too large (at most 2^62 bytes)");
  return number << shift;
}

}  // namespace pipeflow
