#include "pipeflow/tensor/half.h"

#include <bit>
#include <cmath>

namespace pipeflow {

const char* to_string(ComputeFormat format) {
  switch (format) {
    case ComputeFormat::kBf16:
      return "bf16";
    case ComputeFormat::kFp16:
      return "fp16";
    case ComputeFormat::kFp32:
      break;
  }
  return "fp32";
}

std::uint16_t bf16_bits(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);  // quiet, sign kept
  // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a
  // carry into the exponent is the right result (up to inf past the largest).
  const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

float from_bf16_bits(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

float round_to_bf16(float x) { return from_bf16_bits(bf16_bits(x)); }

std::uint16_t fp16_bits(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504: inf
  if (magnitude < 0x38800000u) {
    // Below 2^−14: a subnormal m·2^−24, m = round(|x|·2^24), ties to even
    // (exact in float arithmetic: |x|·2^24 < 2^10 keeps the bits it needs).
    const float scaled = std::bit_cast<float>(magnitude) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 → 15), round 23 mantissa bits to 10.
  const std::uint32_t rebased = magnitude - 0x38000000u;
  const std::uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

float from_fp16_bits(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: m·2^−24
    const float value = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign != 0 ? -value : value;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

float round_to_fp16(float x) { return from_fp16_bits(fp16_bits(x)); }

namespace {

// round_to_bf16 over an array, branch-free so that it vectorises: a NaN
// (exponent all ones, mantissa not zero) keeps its high half, made quiet.
__attribute__((target("prefer-vector-width=512"), noinline)) void round_bf16_array(float* __restrict values,
                                                                                    std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(values[i]);
    const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    const std::uint32_t quiet_nan = (bits | 0x00400000u) & 0xffff0000u;
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    values[i] = std::bit_cast<float>(nan ? quiet_nan : rounded);
  }
}

// bf16_bits over an array, branch-free as above: a stage stashes every
// saved activation through it (nn/half_stash.h), the scalar loop's NaN
// branch made that 20% of a bf16 training step.
__attribute__((target("prefer-vector-width=512"), noinline)) void bf16_bits_array(const float* __restrict values,
                                                                                   std::uint16_t* __restrict bits,
                                                                                   std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(values[i]);
    const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (x >> 16) | 0x40u;
    const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
    bits[i] = static_cast<std::uint16_t>(nan ? quiet_nan : rounded);
  }
}

}  // namespace

void to_half_bits(ComputeFormat format, const float* values, std::uint16_t* bits, std::int64_t n) {
  if (format == ComputeFormat::kBf16) {
    bf16_bits_array(values, bits, n);
  } else {
    for (std::int64_t i = 0; i < n; ++i) bits[i] = fp16_bits(values[i]);
  }
}

void from_half_bits(ComputeFormat format, const std::uint16_t* bits, float* values, std::int64_t n) {
  if (format == ComputeFormat::kBf16) {
    for (std::int64_t i = 0; i < n; ++i) values[i] = from_bf16_bits(bits[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) values[i] = from_fp16_bits(bits[i]);
  }
}

void round_to_format(ComputeFormat format, float* values, std::int64_t n) {
  if (format == ComputeFormat::kBf16) {
    round_bf16_array(values, n);
  } else if (format == ComputeFormat::kFp16) {
    for (std::int64_t i = 0; i < n; ++i) values[i] = round_to_fp16(values[i]);
  }
}

}  // namespace pipeflow
