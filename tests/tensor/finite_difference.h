#pragma once

// Finite-difference checks in double precision, shared by the tensor and nn
// tests: compare an analytic gradient with central differences
// (f(x + h) − f(x − h)) / 2h, whose truncation error is O(h²).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace pipeflow::testing {

// Fills with N(0, scale²) from a seeded generator.
inline void fill_normal(std::span<double> values, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<double> normal(0.0, scale);
  for (double& value : values) value = normal(generator);
}

inline std::vector<double> normal_vector(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<double> values(n);
  fill_normal(values, seed, scale);
  return values;
}

// max_i |numeric_i − analytic_i| / max_i |analytic_i|: the error relative to
// the gradient's size, as the PyTorch reference comparison measures it.
// `loss` re-evaluates the scalar loss from the current contents of x.
template <class Loss>
double relative_gradient_error(std::span<double> x, std::span<const double> analytic, Loss loss,
                               double h = 1e-5) {
  double worst = 0;
  double largest = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2 * h);
    worst = std::max(worst, std::abs(numeric - analytic[i]));
    largest = std::max(largest, std::abs(analytic[i]));
  }
  return largest == 0 ? worst : worst / largest;
}

inline double dot(std::span<const double> a, std::span<const double> b) {
  double total = 0;
  for (std::size_t i = 0; i < a.size(); ++i) total += a[i] * b[i];
  return total;
}

}  // namespace pipeflow::testing
