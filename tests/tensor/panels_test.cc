#include "pipeflow/tensor/panels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "finite_difference.h"
#include "pipeflow/tensor/linear.h"

namespace pipeflow {
namespace {

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  const auto values = testing::normal_vector(n, seed);
  return {values.begin(), values.end()};
}

// Widths around the panel's: narrower than one panel, one exactly, several
// with a narrow last one; every row count up to two row blocks (of 8 or 4)
// and one more, so every remainder.
template <class T>
void check_against_the_definition(double tolerance) {
  const int p = panel_width<T>();
  for (const int out : {3, p, 2 * p + 5, 3 * p}) {
    for (const int in : {1, 7, 64}) {
      const auto w = random_values<T>(static_cast<std::size_t>(in) * out, 1);
      auto panels = w;
      pack_panels(panels.data(), in, out);
      for (int n = 1; n <= 17; ++n) {
        const auto x = random_values<T>(static_cast<std::size_t>(n) * in, 2);
        auto y = random_values<T>(static_cast<std::size_t>(n) * out, 3);
        const auto y0 = y;
        panels_multiply_add(y.data(), x.data(), panels.data(), n, in, out);
        for (int r = 0; r < n; ++r) {
          for (int j = 0; j < out; ++j) {
            double expected = static_cast<double>(y0[static_cast<std::size_t>(r * out + j)]);
            double scale = std::abs(expected);
            for (int k = 0; k < in; ++k) {
              const double term = static_cast<double>(x[static_cast<std::size_t>(r * in + k)]) *
                                  static_cast<double>(w[static_cast<std::size_t>(k * out + j)]);
              expected += term;
              scale += std::abs(term);
            }
            ASSERT_NEAR(y[static_cast<std::size_t>(r * out + j)], expected, tolerance * scale)
                << "out " << out << " in " << in << " n " << n << " row " << r << " column " << j;
          }
        }
      }
    }
  }
}

TEST(Panels, TheProductEqualsTheDefinitionForEveryWidthAndRowCount) {
  check_against_the_definition<float>(1e-6);
  check_against_the_definition<double>(1e-14);
}

// A decode group's rows give the bits they give alone: multiplying 19 rows at
// once, in groups of 8 + 11, or one by one, is the same to the last bit.
TEST(Panels, ARowsResultDoesNotDependOnTheOtherRowsOfTheCall) {
  const int in = 96, out = 3 * panel_width<float>() + 7, n = 19;
  auto panels = random_values<float>(static_cast<std::size_t>(in) * out, 4);
  pack_panels(panels.data(), in, out);
  const auto x = random_values<float>(static_cast<std::size_t>(n) * in, 5);
  const std::vector<float> start(static_cast<std::size_t>(n) * out, 0.25f);
  auto all = start;
  panels_multiply_add(all.data(), x.data(), panels.data(), n, in, out);
  auto split = start;
  panels_multiply_add(split.data(), x.data(), panels.data(), 8, in, out);
  panels_multiply_add(split.data() + 8 * out, x.data() + 8 * in, panels.data(), n - 8, in, out);
  auto alone = start;
  for (int r = 0; r < n; ++r) {
    panels_multiply_add(alone.data() + static_cast<long>(r) * out, x.data() + static_cast<long>(r) * in,
                        panels.data(), 1, in, out);
  }
  EXPECT_EQ(std::memcmp(all.data(), split.data(), all.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(all.data(), alone.data(), all.size() * sizeof(float)), 0);
}

// The affine layer through panels equals it through sgemm, bias and
// residual included.
TEST(Panels, LinearForwardThroughPanelsEqualsItThroughSgemm) {
  const int n = 5, in = 48, out = 80;
  const auto x = random_values<float>(static_cast<std::size_t>(n) * in, 6);
  const auto w = random_values<float>(static_cast<std::size_t>(in) * out, 7);
  const auto b = random_values<float>(static_cast<std::size_t>(out), 8);
  const auto residual = random_values<float>(static_cast<std::size_t>(n) * out, 9);
  auto panels = w;
  pack_panels(panels.data(), in, out);
  std::vector<float> expected(static_cast<std::size_t>(n) * out), y(expected.size());
  linear_forward(expected.data(), x.data(), w.data(), b.data(), residual.data(), n, in, out);
  linear_forward_panels(y.data(), x.data(), panels.data(), b.data(), residual.data(), n, in, out);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-5 * (1 + std::abs(expected[i]))) << i;
}

}  // namespace
}  // namespace pipeflow
