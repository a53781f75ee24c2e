#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace pipeflow::testing {

// ‖a − b‖₂ / ‖b‖₂ in double (‖a − b‖₂ when b is zero): how the tests measure a
// tensor's error against a reference. a and b index like arrays and have
// size(). Tensors of different sizes are not close whatever their values: a
// mismatch is a test failure naming both sizes, and the error is infinite so
// that any bound on it fails too (instead of reading past the shorter one).
template <class A, class B>
double relative_error(const A& a, const B& b) {
  if (a.size() != b.size()) {
    ADD_FAILURE() << "relative_error compares " << a.size() << " values with a reference of " << b.size()
                  << ": the tensors must have the same number of elements";
    return std::numeric_limits<double>::infinity();
  }
  double diff = 0;
  double norm = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// max |a − b| / max |b| in double (max |a − b| when b is zero): the issue's
// measure for logits, where a few large entries decide the sample. Sizes as
// relative_error.
template <class A, class B>
double max_relative_error(const A& a, const B& b) {
  if (a.size() != b.size()) {
    ADD_FAILURE() << "max_relative_error compares " << a.size() << " values with a reference of " << b.size();
    return std::numeric_limits<double>::infinity();
  }
  double diff = 0;
  double top = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    top = std::max(top, std::abs(static_cast<double>(b[i])));
  }
  return top > 0 ? diff / top : diff;
}

}  // namespace pipeflow::testing
