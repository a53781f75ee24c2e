// Rounding to bf16 and fp16: every 16-bit pattern round-trips, halfway cases
// go to even, fp16 overflows to inf past 65504 and keeps subnormals. (Checked
// once, not here, against numpy's float16 and torch 1.13's bfloat16 casts on
// 2^20 floats, normals at scales 1e-9 to 1e7 and random bit patterns: the
// same bits for every one.)

#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "pipeflow/tensor/half.h"

namespace pipeflow {
namespace {

TEST(Half, EveryBf16AndFp16PatternRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float bf = from_bf16_bits(bits);
    if (!std::isnan(bf)) {
      EXPECT_EQ(bf16_bits(bf), bits) << h;
    }
    const float fp = from_fp16_bits(bits);
    if (!std::isnan(fp)) {
      EXPECT_EQ(fp16_bits(fp), bits) << h;
    }
  }
}

TEST(Half, RoundsToNearestWithTiesToEven) {
  // bf16 keeps 8 significant bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(round_to_bf16(1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);  // halfway, odd below: up
  EXPECT_EQ(round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  EXPECT_EQ(round_to_bf16(3.14159265f), 3.140625f);
  // fp16 keeps 11: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(round_to_fp16(1.0f + 0x1p-11f), 1.0f);
  EXPECT_EQ(round_to_fp16(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
  EXPECT_EQ(round_to_fp16(-3.14159265f), -3.140625f);
  EXPECT_EQ(round_to_fp16(0.1f), 0.0999755859375f);
}

TEST(Half, Fp16OverflowsPast65504AndKeepsSubnormals) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_to_fp16(65504.0f), 65504.0f);
  EXPECT_EQ(round_to_fp16(65519.0f), 65504.0f);
  EXPECT_EQ(round_to_fp16(65520.0f), inf);  // halfway to 2^16, and 65504 is odd: inf
  EXPECT_EQ(round_to_fp16(-1e6f), -inf);
  EXPECT_EQ(round_to_fp16(0x1p-24f), 0x1p-24f);      // the smallest subnormal
  EXPECT_EQ(round_to_fp16(0x1p-25f), 0.0f);          // halfway to it: even is 0
  EXPECT_EQ(round_to_fp16(0x1.8p-25f), 0x1p-24f);
  EXPECT_EQ(round_to_fp16(0x1.ffcp-15f), 0x1p-14f);  // rounds up into the normals
  EXPECT_TRUE(std::isnan(round_to_fp16(std::nanf(""))));
  // bf16 has float's range: no overflow below float's own.
  EXPECT_EQ(round_to_bf16(1e30f), 1.0002555517425873e30f);  // torch.tensor(1e30).bfloat16()
  EXPECT_TRUE(std::isnan(round_to_bf16(std::nanf(""))));
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()), inf);
}

// The array loops (branch-free, vectorised), in place and to bits, give the
// scalar rounding's bits for every high half and low halves at and around
// the halfway point, NaNs, infinities and subnormals included.
TEST(Half, TheArrayRoundingIsTheScalarOne) {
  std::vector<float> values;
  for (std::uint32_t high = 0; high < 0x10000u; ++high) {
    for (const std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      values.push_back(std::bit_cast<float>(high << 16 | low));
    }
  }
  std::vector<float> rounded = values;
  round_to_format(ComputeFormat::kBf16, rounded.data(), static_cast<std::int64_t>(rounded.size()));
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(rounded[i]), std::bit_cast<std::uint32_t>(round_to_bf16(values[i])))
        << std::hex << std::bit_cast<std::uint32_t>(values[i]);
  }
  std::vector<std::uint16_t> bits(values.size());
  to_half_bits(ComputeFormat::kBf16, values.data(), bits.data(), static_cast<std::int64_t>(values.size()));
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(bits[i], bf16_bits(values[i])) << std::hex << std::bit_cast<std::uint32_t>(values[i]);
  }
}

// Where the CPU converts in hardware (AVX-512 BF16, which flushes denormal
// inputs to zero) a block of 16 holding a denormal goes through the portable
// loop: the same bits as the scalar rounding with denormals at every lane of
// a block among normal values, from every start modulo 16 and with every
// tail length (start s leaves a tail of s). Then again with MXCSR set to
// flush denormals and round upwards, which neither path may heed.
void expect_array_rounding_is_the_scalar_one(const std::vector<float>& values) {
  for (std::size_t start = 0; start < 16; ++start) {
    const auto n = static_cast<std::int64_t>((values.size() - 32) / 16 * 16 + start);
    std::vector<float> rounded(values.begin() + static_cast<long>(start), values.begin() + static_cast<long>(start) + n);
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
    to_half_bits(ComputeFormat::kBf16, values.data() + start, bits.data(), n);
    round_to_format(ComputeFormat::kBf16, rounded.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = values[start + static_cast<std::size_t>(i)];
      ASSERT_EQ(bits[static_cast<std::size_t>(i)], bf16_bits(x)) << std::hex << std::bit_cast<std::uint32_t>(x);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(rounded[static_cast<std::size_t>(i)]),
                std::bit_cast<std::uint32_t>(round_to_bf16(x)))
          << std::hex << std::bit_cast<std::uint32_t>(x);
    }
  }
}

TEST(Half, TheArrayRoundingKeepsDenormalsAmongNormalValues) {
  std::vector<float> values;
  for (std::uint32_t high = 0; high < 0x10000u; high += 7) {
    for (const std::uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u}) {
      values.push_back(std::bit_cast<float>(high << 16 | low));
    }
  }
  for (std::uint32_t denormal = 1; denormal < 0x800000u; denormal = denormal * 3 + 1) {
    values.push_back(std::bit_cast<float>(denormal));
    values.push_back(std::bit_cast<float>(denormal | 0x80000000u));
  }
  std::shuffle(values.begin(), values.end(), std::mt19937(7));
  expect_array_rounding_is_the_scalar_one(values);
  const unsigned int mxcsr = _mm_getcsr();
  _mm_setcsr((mxcsr & ~0x6000u) | 0x8040u | 0x4000u);  // FTZ, DAZ, round towards +inf
  expect_array_rounding_is_the_scalar_one(values);
  _mm_setcsr(mxcsr);
}

TEST(Half, RoundingAnArrayFollowsTheFormat) {
  std::vector<float> values = {1.0f + 0x1p-10f, 70000.0f, 0.1f};
  std::vector<float> copy = values;
  round_to_format(ComputeFormat::kFp32, copy.data(), 3);
  EXPECT_EQ(copy, values);
  round_to_format(ComputeFormat::kBf16, copy.data(), 3);
  EXPECT_EQ(copy, (std::vector<float>{1.0f, 70144.0f, round_to_bf16(0.1f)}));
  copy = values;
  round_to_format(ComputeFormat::kFp16, copy.data(), 3);
  EXPECT_EQ(copy, (std::vector<float>{1.0f + 0x1p-10f, std::numeric_limits<float>::infinity(), 0.0999755859375f}));
}

}  // namespace
}  // namespace pipeflow
