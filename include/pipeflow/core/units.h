#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

// A byte count as nccl-tests' options write it: a whole number with an
// optional K, M or G (powers of 1024; "KiB", "MiB", "GiB" too): "4096", "1K",
// "64M". Throws Error naming `option` and the value otherwise, or when it
// exceeds 2^62 bytes.
std::int64_t parse_byte_size(std::string_view text, std::string_view option);

}  // namespace pipeflow
