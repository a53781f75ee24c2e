#include "pipeflow/tensor/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "../support/error_of.h"
#include "finite_difference.h"
#include "pipeflow/tensor/half.h"

namespace pipeflow {
namespace {

// C = A·Bᵀ by the definition, in double.
std::vector<double> naive_abt(const std::vector<float>& a, const std::vector<float>& b, int m, int n, int k) {
  std::vector<double> c(static_cast<std::size_t>(m) * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double total = 0;
      for (int p = 0; p < k; ++p) total += static_cast<double>(a[i * k + p]) * b[j * k + p];
      c[i * n + j] = total;
    }
  }
  return c;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  const auto values = testing::normal_vector(n, seed);
  return {values.begin(), values.end()};
}

TEST(Gemm, MatchesTheDefinitionAndRunsOnOneBlasThread) {
  const int m = 33, n = 17, k = 65;
  const auto a = random_floats(m * k, 1);
  const auto b = random_floats(n * k, 2);
  std::vector<float> c(m * n, 1.0f);
  gemm<float>(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
  const auto expected = naive_abt(a, b, m, n, k);
  for (int i = 0; i < m * n; ++i) EXPECT_NEAR(c[i], expected[i], 1e-4) << i;
  EXPECT_EQ(blas_threads(), 1);
}

TEST(Gemm, StridedViewsMultiplyOneColumnBlock) {
  // A is the middle 2 columns of a [3, 6] matrix (lda 6); C accumulates (beta 1).
  const std::vector<float> a = {0, 1, 2, 0, 0, 0, 0, 3, 4, 0, 0, 0, 0, 5, 6, 0, 0, 0};
  const std::vector<float> b = {1, 0, 0, 1};  // identity [2, 2]
  std::vector<float> c = {10, 10, 10, 10, 10, 10};
  gemm<float>(Transpose::kNo, Transpose::kNo, 3, 2, 2, 1.0f, a.data() + 1, 6, b.data(), 2, 1.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{11, 12, 13, 14, 15, 16}));
}

// One row of C (a decode step): every combination of transposes, a strided
// A, alpha and beta give the definition.
TEST(Gemm, OneRowMatchesTheDefinitionForEveryTranspose) {
  const int n = 7, k = 5;
  const auto a = random_floats(3 * k, 6);  // as [k, 3] (lda 3, column 1) or one row
  const auto b = random_floats(n * k, 7);  // as [n, k] (Bᵀ stored) or [k, n]
  for (const Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (const Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      std::vector<float> c(n, 2.0f);
      const int lda = ta == Transpose::kYes ? 3 : k;
      gemm<float>(ta, tb, 1, n, k, 0.5f, a.data() + (ta == Transpose::kYes ? 1 : 0), lda, b.data(),
                  tb == Transpose::kYes ? k : n, 3.0f, c.data(), n);
      for (int j = 0; j < n; ++j) {
        double total = 0;
        for (int p = 0; p < k; ++p) {
          const double left = ta == Transpose::kYes ? a[p * 3 + 1] : a[p];
          const double right = tb == Transpose::kYes ? b[j * k + p] : b[p * n + j];
          total += left * right;
        }
        EXPECT_NEAR(c[j], 0.5 * total + 3.0 * 2.0, 1e-5) << j;
      }
    }
  }
}

// Inside a bf16 scope a product is the definition's over the operands
// rounded to bf16, summed in fp32: every transpose, strided operands, a
// strided C, alpha and beta. The bound: fp32 accumulation over k = 70
// products of N(0, 1) values, k · 2^−24 · Σ|a·b| < 1e-4 here; the rounding
// itself moves the results by ~1e-2, far outside it. The same call repeats
// its bits; outside the scope (or in a nested fp32 one) it is sgemm again.
TEST(Gemm, ABf16ScopeMultipliesTheOperandsRoundedToBf16AccumulatingInFp32) {
  if (!bf16_matmul_available()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (AVX2 alone)";
  const int m = 33, n = 19, k = 70, pad = 3;
  const auto a = random_floats(static_cast<std::size_t>(k + pad) * (k + pad), 8);
  const auto b = random_floats(static_cast<std::size_t>(k + pad) * (k + pad), 9);
  const int ldc = n + pad;
  const std::vector<float> c0 = random_floats(static_cast<std::size_t>(m) * ldc, 10);
  for (const Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (const Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      SCOPED_TRACE(::testing::Message() << "transposes " << (ta == Transpose::kYes) << (tb == Transpose::kYes));
      const int lda = (ta == Transpose::kYes ? m : k) + pad;
      const int ldb = (tb == Transpose::kYes ? k : n) + pad;
      const auto left = [&](int i, int p) { return ta == Transpose::kYes ? a[p * lda + i] : a[i * lda + p]; };
      const auto right = [&](int p, int j) { return tb == Transpose::kYes ? b[j * ldb + p] : b[p * ldb + j]; };
      const auto product = [&](GemmPrecision precision) {
        const GemmPrecisionScope scope(precision);
        std::vector<float> c = c0;
        gemm<float>(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 3.0f, c.data(), ldc);
        return c;
      };
      const std::vector<float> bf16 = product(GemmPrecision::kBf16);
      double moved = 0;
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double rounded = 0, exact = 0;
          for (int p = 0; p < k; ++p) {
            rounded += static_cast<double>(round_to_bf16(left(i, p))) * round_to_bf16(right(p, j));
            exact += static_cast<double>(left(i, p)) * right(p, j);
          }
          const double before = c0[i * ldc + j];
          EXPECT_NEAR(bf16[i * ldc + j], 0.5 * rounded + 3.0 * before, 1e-4) << i << ", " << j;
          moved = std::max(moved, std::abs(bf16[i * ldc + j] - (0.5 * exact + 3.0 * before)));
        }
        for (int j = n; j < ldc; ++j) EXPECT_EQ(bf16[i * ldc + j], c0[i * ldc + j]);  // C's padding untouched
      }
      EXPECT_GT(moved, 1e-3);
      EXPECT_EQ(product(GemmPrecision::kBf16), bf16);
      const GemmPrecisionScope outer(GemmPrecision::kBf16);
      const std::vector<float> fp32 = product(GemmPrecision::kFp32);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double exact = 0;
          for (int p = 0; p < k; ++p) exact += static_cast<double>(left(i, p)) * right(p, j);
          EXPECT_NEAR(fp32[i * ldc + j], 0.5 * exact + 3.0 * c0[i * ldc + j], 1e-4);
        }
      }
    }
  }
}

// gemm_batched is its grid's gemm calls: a 2 x 3 x 2 grid with A repeated
// along the first dimension and B along the last (stride 0), strided C,
// every transpose, alpha and beta. fp32 and double: the calls, bit for bit.
// bf16 (one oneDNN matmul for the grid): the calls' values (fp32
// accumulation of the same rounded operands, 1e-4 as above), the same bits
// on a rerun, and the same bits from operands a Bf16Operands range stands
// for (NaN floats, never read) as from those floats rounded. `gap` moves the
// C matrices apart: a second layout of the same shape on the same thread
// (bf16 keeps a matmul a layout) must not take the first one's.
template <class T>
void expect_batched_products_are_their_gemm_calls(GemmPrecision precision, long gap = 0) {
  const int m = 5, n = 7, k = 9, pad = 2;
  GemmBatch grid;
  const int count[3] = {2, 3, 2};
  const long a_matrix = (k + pad) * (k + pad), b_matrix = (k + pad) * (n + pad), c_matrix = m * (n + pad);
  for (int i = 0; i < 3; ++i) grid.count[i] = count[i];
  const long a_stride[3] = {0, a_matrix * 2, a_matrix};
  const long b_stride[3] = {b_matrix * 3, b_matrix, 0};
  const long c_stride[3] = {c_matrix * 6 + 3 + 3 * gap, c_matrix * 2 + 1 + gap, c_matrix};
  for (int i = 0; i < 3; ++i) {
    grid.a_stride[i] = a_stride[i];
    grid.b_stride[i] = b_stride[i];
    grid.c_stride[i] = c_stride[i];
  }
  const auto values = [](std::size_t size, std::uint64_t seed) {
    const auto normal = testing::normal_vector(size, seed);
    return std::vector<T>(normal.begin(), normal.end());
  };
  const std::vector<T> a = values(a_matrix * 6, 31), b = values(b_matrix * 6, 32);
  const std::vector<T> c0 = values(c_matrix * 12 + 8 + 5 * gap, 33);
  const GemmPrecisionScope scope(precision);
  for (const Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (const Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      SCOPED_TRACE(::testing::Message() << "transposes " << (ta == Transpose::kYes) << (tb == Transpose::kYes));
      const int lda = (ta == Transpose::kYes ? m : k) + pad;
      const int ldb = (tb == Transpose::kYes ? k : n) + pad;
      const auto batched = [&](const std::vector<T>& left, const std::vector<T>& right) {
        std::vector<T> c = c0;
        gemm_batched<T>(grid, ta, tb, m, n, k, T(0.5), left.data(), lda, right.data(), ldb, T(3), c.data(), n + pad);
        return c;
      };
      std::vector<T> calls = c0;
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 3; ++j) {
          for (int l = 0; l < 2; ++l) {
            gemm<T>(ta, tb, m, n, k, T(0.5), a.data() + j * a_stride[1] + l * a_stride[2], lda,
                    b.data() + i * b_stride[0] + j * b_stride[1], ldb, T(3),
                    calls.data() + i * c_stride[0] + j * c_stride[1] + l * c_stride[2], n + pad);
          }
        }
      }
      const std::vector<T> together = batched(a, b);
      if (precision == GemmPrecision::kFp32) {
        EXPECT_EQ(together, calls);
        continue;
      }
      for (std::size_t i = 0; i < calls.size(); ++i) EXPECT_NEAR(together[i], calls[i], 1e-4) << i;
      EXPECT_EQ(batched(a, b), together);
      if constexpr (std::is_same_v<T, float>) {
        std::vector<std::uint16_t> a_bits(a.size()), b_bits(b.size());
        to_half_bits(ComputeFormat::kBf16, a.data(), a_bits.data(), static_cast<std::int64_t>(a.size()));
        to_half_bits(ComputeFormat::kBf16, b.data(), b_bits.data(), static_cast<std::int64_t>(b.size()));
        const std::vector<float> a_nan(a.size(), std::nanf("")), b_nan(b.size(), std::nanf(""));
        Bf16Operands lent;
        lent.add(a_nan.data(), a_bits);
        lent.add(b_nan.data(), b_bits);
        EXPECT_EQ(batched(a_nan, b_nan), together);
      }
    }
  }
}

TEST(Gemm, BatchedProductsAreTheirGemmCalls) {
  expect_batched_products_are_their_gemm_calls<double>(GemmPrecision::kFp32);
  expect_batched_products_are_their_gemm_calls<float>(GemmPrecision::kFp32);
  if (!bf16_matmul_available()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (AVX2 alone)";
  expect_batched_products_are_their_gemm_calls<float>(GemmPrecision::kBf16);
  expect_batched_products_are_their_gemm_calls<float>(GemmPrecision::kBf16, 5);
}

// GemmCallTimes counts each gemm and gemm_batched call once under its shape
// (a float batch's products are gemm calls inside it, not counted again),
// only on its own thread and only while it lives; the innermost of two
// records.
TEST(Gemm, CallTimesCountEachCallOnceByItsShape) {
  std::vector<double> a(6 * 4, 0.5), b(4 * 5, 0.25), c(6 * 5, 0.0);
  const auto one_gemm = [&] {
    gemm<double>(Transpose::kNo, Transpose::kYes, 6, 5, 4, 1.0, a.data(), 4, b.data(), 4, 0.0, c.data(), 5);
  };
  const GemmBatch three{{3, 1, 1}, {24, 0, 0}, {30, 0, 0}, {20, 0, 0}};
  GemmCallTimes outer;
  one_gemm();
  {
    GemmCallTimes inner;
    one_gemm();
    one_gemm();
    gemm_batched<float>(three, Transpose::kYes, Transpose::kNo, 4, 5, 6, 1.0f, std::vector<float>(72, 1.0f).data(),
                        4, std::vector<float>(90, 1.0f).data(), 5, 0.0f, std::vector<float>(60).data(), 5);
    std::thread([&] { one_gemm(); }).join();  // another thread's: not this object's
    const std::vector<GemmCallTimes::Entry> entries = inner.by_time();
    ASSERT_EQ(entries.size(), 2u);
    const auto find = [&](const GemmCallShape& shape) {
      return std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.shape == shape; });
    };
    const auto pair = find({6, 5, 4, false, true, 1});
    const auto batch = find({4, 5, 6, true, false, 3});
    ASSERT_NE(pair, entries.end());
    ASSERT_NE(batch, entries.end());
    EXPECT_EQ(pair->calls, 2);
    EXPECT_EQ(batch->calls, 1);
    EXPECT_GT(pair->seconds, 0);
    EXPECT_GT(batch->seconds, 0);
    EXPECT_GE(entries[0].seconds, entries[1].seconds);  // the most time first
    EXPECT_DOUBLE_EQ(batch->shape.flops(), 2.0 * 4 * 5 * 6 * 3);
  }
  one_gemm();
  const std::vector<GemmCallTimes::Entry> entries = outer.by_time();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].calls, 2);  // before and after the inner object
}

// Floats that stand for bf16 bits (Bf16Operands): the matmul takes the bits
// as they are, for A or B, every transpose, a strided operand inside a
// larger stand-in, and never reads the floats (all NaN here, which any read
// would spread to C). The products equal, bit for bit, those of the same
// call on the bits widened into floats (rounding them is exact): what a
// bf16 stage's matrices computed when it widened them. A moved object
// keeps the ranges; once it is gone the floats are read again (NaN).
TEST(Gemm, Bf16OperandsHandTheMatmulTheirBitsAsTheyAre) {
  if (!bf16_matmul_available()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (AVX2 alone)";
  const GemmPrecisionScope bf16(GemmPrecision::kBf16);
  const int m = 24, n = 40, k = 36, pad = 4, ldc = n;
  const auto a = random_floats(static_cast<std::size_t>(k + pad) * (k + pad), 11);
  const auto b = random_floats(static_cast<std::size_t>(k + pad) * (n + pad), 12);
  const std::vector<float> c0 = random_floats(static_cast<std::size_t>(m) * ldc, 13);
  const auto bits_of = [](const std::vector<float>& x) {
    std::vector<std::uint16_t> bits(x.size());
    to_half_bits(ComputeFormat::kBf16, x.data(), bits.data(), static_cast<std::int64_t>(x.size()));
    return bits;
  };
  const auto widened = [](const std::vector<std::uint16_t>& bits) {
    std::vector<float> x(bits.size());
    from_half_bits(ComputeFormat::kBf16, bits.data(), x.data(), static_cast<std::int64_t>(bits.size()));
    return x;
  };
  const std::vector<std::uint16_t> a_bits = bits_of(a), b_bits = bits_of(b);
  const std::vector<float> a_widened = widened(a_bits), b_widened = widened(b_bits);
  const std::vector<float> a_nan(a.size(), std::nanf("")), b_nan(b.size(), std::nanf(""));
  for (const bool stand_in_is_b : {true, false}) {
    for (const Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (const Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        SCOPED_TRACE(::testing::Message() << "B stands in " << stand_in_is_b << ", transposes "
                                          << (ta == Transpose::kYes) << (tb == Transpose::kYes));
        const int lda = (ta == Transpose::kYes ? m : k) + pad;
        const int ldb = (tb == Transpose::kYes ? k : n) + pad;
        // One row and one column in: the operand strided inside its stand-in.
        const auto product = [&](const std::vector<float>& left, const std::vector<float>& right) {
          std::vector<float> c = c0;
          gemm<float>(ta, tb, m, n, k, 0.5f, left.data() + lda + 1, lda, right.data() + ldb + 1, ldb, 1.0f, c.data(),
                      ldc);
          return c;
        };
        const std::vector<float> expected = product(a_widened, b_widened);
        const std::vector<float>& left = stand_in_is_b ? a : a_nan;
        const std::vector<float>& right = stand_in_is_b ? b_nan : b;
        std::vector<float> taken;
        {
          Bf16Operands added;
          if (stand_in_is_b) {
            added.add(b_nan.data(), b_bits);
          } else {
            added.add(a_nan.data(), a_bits);
          }
          const Bf16Operands moved = std::move(added);
          taken = product(left, right);
        }
        EXPECT_EQ(taken, expected);
        EXPECT_TRUE(std::isnan(product(left, right)[0]));
      }
    }
  }
  // A range over floats another still stands for: the other outlived the
  // floats it was added for (freed, now a new tensor's).
  {
    Bf16Operands earlier, later;
    earlier.add(b_nan.data(), b_bits);
    EXPECT_EQ(testing::error_of([&] { later.add(b_nan.data() + 8, std::span(b_bits).first(4)); }),
              "internal: a Bf16Operands range of 4 floats overlaps one still registered: a range must end before "
              "its floats are freed");
  }
  // An operand running past its range would read floats never written.
  Bf16Operands half_of_b;
  half_of_b.add(b_nan.data(), std::span(b_bits).first(b_bits.size() / 2));
  std::vector<float> c = c0;
  EXPECT_EQ(testing::error_of([&] {
              gemm<float>(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data(), k, b_nan.data(), n, 0.0f, c.data(),
                          ldc);
            }),
            "internal: a bf16 GEMM operand (36 x 40 at row stride 40, a grid of 1 x 1 x 1 strided 0, 0, 0: 1440 "
            "floats from first to last) lies partly in a Bf16Operands range: add the whole tensor it belongs to as "
            "one range");
}

// round_for_gemms: a strided block rounded once, which the GEMMs that read
// it (as A, then transposed as B) take as those bits: the same products as
// rounding it in each, and floats written since (which a caller must not
// do) are not read. Under kFp32 it adds nothing: the floats are read.
TEST(Gemm, FloatsRoundedOnceForSeveralGemmsGiveTheirProductsBitForBit) {
  if (!bf16_matmul_available()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (AVX2 alone)";
  const int rows = 12, columns = 20, ld = 28, n = 8;
  std::vector<float> x = random_floats(static_cast<std::size_t>(rows) * ld, 21);
  const std::vector<float> right = random_floats(static_cast<std::size_t>(columns) * n, 22);
  const std::vector<float> left = random_floats(static_cast<std::size_t>(n) * rows, 23);
  const auto products = [&] {
    std::vector<float> c(static_cast<std::size_t>(rows) * n + static_cast<std::size_t>(n) * columns, 0.0f);
    gemm<float>(Transpose::kNo, Transpose::kNo, rows, n, columns, 1.0f, x.data(), ld, right.data(), n, 0.0f,
                c.data(), n);
    gemm<float>(Transpose::kNo, Transpose::kNo, n, columns, rows, 1.0f, left.data(), rows, x.data(), ld, 0.0f,
                c.data() + static_cast<std::ptrdiff_t>(rows) * n, columns);
    return c;
  };
  const GemmPrecisionScope bf16(GemmPrecision::kBf16);
  const std::vector<float> expected = products();
  Bf16Scratch scratch;
  Bf16Operands rounded;
  round_for_gemms(x.data(), rows, columns, ld, scratch, rounded);
  ASSERT_EQ(scratch.capacity, static_cast<std::size_t>((rows - 1) * ld + columns));
  const std::uint16_t* bits = scratch.bits.get();
  for (int row = 0; row < rows; ++row) {  // laid out as x is, row stride ld
    for (int column = 0; column < columns; ++column) {
      const std::size_t at = static_cast<std::size_t>(row) * ld + static_cast<std::size_t>(column);
      ASSERT_EQ(bits[at], bf16_bits(x[at])) << "row " << row << ", column " << column;
    }
  }
  for (int row = 0; row < rows; ++row) x[static_cast<std::size_t>(row) * ld + 3] = std::nanf("");
  EXPECT_EQ(products(), expected);
  {
    const GemmPrecisionScope fp32(GemmPrecision::kFp32);
    Bf16Scratch none;
    Bf16Operands not_rounded;
    round_for_gemms(x.data(), rows, columns, ld, none, not_rounded);
    EXPECT_EQ(none.bits, nullptr);
  }
}

// A bias added by the product itself (oneDNN's bias argument under kBf16)
// gives what C filled with the bias and the product added onto it gives:
// the same bits in fp32 (the same calls); in bf16 the same to float
// rounding, an addition's place in oneDNN's kernel being its own (the same
// bits on AMD Zen 5's AVX-512 BF16 kernels). C's columns past n are left
// alone (the loop covers them).
TEST(Gemm, ABiasAddedByTheProductEqualsTheProductAddedOntoTheBias) {
  constexpr int m = 37, n = 24, k = 40, ldc = 30;
  const std::vector<float> a = random_floats(static_cast<std::size_t>(m) * k, 31);
  const std::vector<float> b = random_floats(static_cast<std::size_t>(k) * n, 32);
  const std::vector<float> bias = random_floats(n, 33);
  std::vector<GemmPrecision> precisions{GemmPrecision::kFp32};
  if (bf16_matmul_available()) precisions.push_back(GemmPrecision::kBf16);
  for (const GemmPrecision precision : precisions) {
    SCOPED_TRACE(to_string(precision));
    const GemmPrecisionScope scope(precision);
    std::vector<float> expected(static_cast<std::size_t>(m) * ldc, -7.0f);
    for (int row = 0; row < m; ++row) std::copy(bias.begin(), bias.end(), expected.begin() + row * ldc);
    gemm<float>(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data(), k, b.data(), n, 1.0f, expected.data(), ldc);
    std::vector<float> c(static_cast<std::size_t>(m) * ldc, -7.0f);
    gemm_bias(m, n, k, a.data(), k, b.data(), n, bias.data(), c.data(), ldc);
    if (precision == GemmPrecision::kFp32) {
      EXPECT_EQ(std::memcmp(c.data(), expected.data(), c.size() * sizeof(float)), 0);
    }
    for (std::size_t i = 0; i < c.size(); ++i) {
      ASSERT_NEAR(c[i], expected[i], 1e-5f * (std::fabs(expected[i]) + 1.0f)) << "element " << i;
    }
  }
}

// PIPEFLOW_BF16_GEMM chooses the path of kAuto; the forced choices ignore
// it. Where oneDNN has no bf16 matmul (AVX2 alone), bf16 asked for either
// way is refused with the fix.
TEST(Gemm, TheBf16PathIsChosenByTheEnvironmentOrTheCpu) {
  const bool available = bf16_matmul_available();
  const std::string refused = "oneDNN has no bf16 matmul on this CPU (it needs AVX-512): multiply in fp32 "
                              "(PIPEFLOW_BF16_GEMM=fp32, or unset it to let the CPU decide)";
  const auto expect_bf16 = [&](Bf16Gemm choice, const std::string& asked_by) {
    if (available) {
      EXPECT_EQ(resolve(choice), GemmPrecision::kBf16);
    } else {
      EXPECT_EQ(testing::error_of([&] { resolve(choice); }), asked_by + ": " + refused);
    }
  };
  EXPECT_TRUE(available || !native_bf16_gemm());
  EXPECT_EQ(resolve(Bf16Gemm::kFp32), GemmPrecision::kFp32);
  expect_bf16(Bf16Gemm::kBf16, "bf16 GEMMs asked for");
  const char* before = std::getenv("PIPEFLOW_BF16_GEMM");
  const std::string saved = before == nullptr ? "" : before;
  ::setenv("PIPEFLOW_BF16_GEMM", "fp32", 1);
  EXPECT_EQ(resolve(Bf16Gemm::kAuto), GemmPrecision::kFp32);
  expect_bf16(Bf16Gemm::kBf16, "bf16 GEMMs asked for");
  ::setenv("PIPEFLOW_BF16_GEMM", "bf16", 1);
  expect_bf16(Bf16Gemm::kAuto, "PIPEFLOW_BF16_GEMM = 'bf16'");
  ::setenv("PIPEFLOW_BF16_GEMM", "fast", 1);
  EXPECT_EQ(testing::error_of([] { resolve(Bf16Gemm::kAuto); }),
            "PIPEFLOW_BF16_GEMM = 'fast': must be fp32 or bf16 (how a bf16 run multiplies): unset it to let the CPU "
            "decide");
  ::unsetenv("PIPEFLOW_BF16_GEMM");
  EXPECT_EQ(resolve(Bf16Gemm::kAuto), native_bf16_gemm() ? GemmPrecision::kBf16 : GemmPrecision::kFp32);
  if (before != nullptr) ::setenv("PIPEFLOW_BF16_GEMM", saved.c_str(), 1);
}

// Each worker's GEMMs run on the worker's own thread alone: oneDNN's OpenMP
// thread count is per thread, so each thread's first call sets its own (the
// engine's workers are such threads: p workers use p cores).
TEST(Gemm, EveryCallingThreadMultipliesOnOneThread) {
  const std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  std::vector<int> threads(2, 0);
  std::vector<std::vector<float>> c(2, std::vector<float>(4));
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      gemm<float>(Transpose::kNo, Transpose::kNo, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c[w].data(), 2);
      threads[w] = blas_threads();
    });
  }
  for (std::thread& worker : workers) worker.join();
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(threads[w], 1) << "worker " << w;
    EXPECT_EQ(c[w], (std::vector<float>{19, 22, 43, 50})) << "worker " << w;  // [1 2; 3 4]·[5 6; 7 8]
  }
}

// Two workers multiplying at once must each get exactly what a lone call gets:
// the contract pipeline workers rely on (one BLAS thread per worker).
TEST(Gemm, ConcurrentCallsFromTwoThreadsAreBitIdenticalToSerialOnes) {
  const int m = 256, n = 192, k = 320;
  const auto a = random_floats(m * k, 3);
  const auto b = random_floats(n * k, 4);
  const auto a2 = random_floats(m * k, 5);
  auto multiply = [&](const std::vector<float>& left) {
    std::vector<float> c(m * n);
    gemm<float>(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, left.data(), k, b.data(), k, 0.0f, c.data(), n);
    return c;
  };
  const auto serial_first = multiply(a);
  const auto serial_second = multiply(a2);
  std::vector<float> concurrent_first;
  std::vector<float> concurrent_second;
  for (int round = 0; round < 20; ++round) {
    std::thread first([&] { concurrent_first = multiply(a); });
    std::thread second([&] { concurrent_second = multiply(a2); });
    first.join();
    second.join();
    ASSERT_EQ(std::memcmp(concurrent_first.data(), serial_first.data(), serial_first.size() * sizeof(float)), 0);
    ASSERT_EQ(std::memcmp(concurrent_second.data(), serial_second.data(), serial_second.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace pipeflow
