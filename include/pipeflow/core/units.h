#pragma once

#include <cstdint>
#include <string>

namespace pipeflow {

inline constexpr double kKiB = 1024.0;
inline constexpr double kMiB = 1024.0 * kKiB;
inline constexpr double kGiB = 1024.0 * kMiB;

// Human-readable quantities for tables and logs (three significant digits).
std::string format_bytes(double bytes);         // "1.50 GiB", "512 B"
std::string format_seconds(double seconds);     // "12.3 ms", "4.00 s", "850 us"
std::string format_si(double value, const std::string& unit);  // "1.23 TFLOP/s"
std::string format_percent(double fraction);    // "15.8%"
std::string format_parameters(double count);    // parameter counts as people write them: "124.4M", "174.60B"
// "1 rank", "4 ranks"; `plural` for nouns that do not just add an s.
std::string format_count(std::int64_t count, const std::string& singular, const std::string& plural = "");

}  // namespace pipeflow
