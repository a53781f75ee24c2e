#include "pipeflow/tensor/half.h"

#include <immintrin.h>

#include <bit>
#include <cmath>

#include "pipeflow/tensor/core_peak.h"

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

// AVX-512 BF16's conversion (vcvtneps2bf16) rounds as bf16_bits does, to
// nearest with ties to even, a NaN made quiet with its sign and high bits
// kept, except that it flushes a denormal input to zero where bf16_bits
// rounds it to a bf16 denormal. So 16 values at a time go through the
// instruction, and a block holding a denormal through the portable loop:
// the same bits on every CPU. 1.2-1.9x the portable loop's rate on AMD Zen 5
// (128K-1.5M values, in cache and not).
// The instruction ignores MXCSR (no DAZ, FTZ or rounding mode applies), as
// the integer loop does. The CPU qualifies as for the core's bf16 peak
// kernel (AVX-512 F and BF16; GCC's and clang's BF16 target implies BW).
bool has_bf16_conversion() {
  static const bool has = [] {
    const CpuFeatures cpu = detect_cpu_features();
    return cpu.avx512f && cpu.avx512_bf16;
  }();
  return has;
}

// The lanes of 16 floats that are denormal: exponent bits 0, magnitude not.
__attribute__((target("avx512f"))) __mmask16 denormal_lanes(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  return _mm512_mask_testn_epi32_mask(_mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x7fffffff)), bits,
                                      _mm512_set1_epi32(0x7f800000));
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void bf16_bits_array_avx512(const float* values,
                                                                                   std::uint16_t* bits,
                                                                                   std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(values + i);
    if (denormal_lanes(x) != 0) {
      bf16_bits_array(values + i, bits + i, 16);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + i), (__m256i)_mm512_cvtneps_pbh(x));
    }
  }
  if (i < n) bf16_bits_array(values + i, bits + i, n - i);
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void round_bf16_array_avx512(float* values, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(values + i);
    if (denormal_lanes(x) != 0) {
      round_bf16_array(values + i, 16);
    } else {
      const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(x);
      // (the zero-masked forms: GCC 12 warns of the plain ones' undefined lanes)
      const __m512i widened = _mm512_maskz_cvtepu16_epi32(0xffff, rounded);
      _mm512_storeu_si512(values + i, _mm512_maskz_slli_epi32(0xffff, widened, 16));
    }
  }
  if (i < n) round_bf16_array(values + i, n - i);
}

}  // namespace

void to_half_bits(ComputeFormat format, const float* values, std::uint16_t* bits, std::int64_t n) {
  if (format == ComputeFormat::kBf16) {
    if (has_bf16_conversion()) {
      bf16_bits_array_avx512(values, bits, n);
    } else {
      bf16_bits_array(values, bits, n);
    }
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
    if (has_bf16_conversion()) {
      round_bf16_array_avx512(values, n);
    } else {
      round_bf16_array(values, n);
    }
  } else if (format == ComputeFormat::kFp16) {
    for (std::int64_t i = 0; i < n; ++i) values[i] = round_to_fp16(values[i]);
  }
}

}  // namespace pipeflow
