#include "pipeflow/tensor/gemm.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "finite_difference.h"

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
