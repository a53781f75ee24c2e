// Every kernel's backward against central differences in double precision.
// The scalar checked is L = Σ out ⊙ R for a fixed random R, so ∂L/∂out = R.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "finite_difference.h"
#include "pipeflow/tensor/attention.h"
#include "pipeflow/tensor/cross_entropy.h"
#include "pipeflow/tensor/embedding.h"
#include "pipeflow/tensor/gelu.h"
#include "pipeflow/tensor/layernorm.h"
#include "pipeflow/tensor/linear.h"
#include "vector_math.h"

namespace pipeflow {
namespace {

using testing::dot;
using testing::normal_vector;
using testing::relative_gradient_error;

constexpr double kTolerance = 1e-7;

TEST(KernelGradient, LinearWithResidualMatchesFiniteDifferences) {
  const int n = 5, in = 7, out = 6;
  auto x = normal_vector(n * in, 1);
  auto w = normal_vector(in * out, 2);
  auto b = normal_vector(out, 3);
  auto residual = normal_vector(n * out, 4);
  const auto r = normal_vector(n * out, 5);
  std::vector<double> y(n * out);
  auto loss = [&] {
    linear_forward(y.data(), x.data(), w.data(), b.data(), residual.data(), n, in, out);
    return dot(y, r);
  };
  std::vector<double> dx(n * in), dw(in * out), db(out);
  linear_backward_input(dx.data(), r.data(), w.data(), n, in, out);
  linear_backward_weight(dw.data(), db.data(), x.data(), r.data(), n, in, out);
  EXPECT_LT(relative_gradient_error(x, dx, loss), kTolerance);
  EXPECT_LT(relative_gradient_error(w, dw, loss), kTolerance);
  EXPECT_LT(relative_gradient_error(b, db, loss), kTolerance);
  EXPECT_LT(relative_gradient_error(residual, r, loss), kTolerance);
}

TEST(KernelGradient, LayerNormMatchesFiniteDifferences) {
  const int n = 4, c = 37;  // c not a multiple of the 16 reduction lanes
  auto x = normal_vector(n * c, 11, 2.0);
  auto w = normal_vector(c, 12);
  auto b = normal_vector(c, 13);
  const auto r = normal_vector(n * c, 14);
  std::vector<double> y(n * c), mean(n), rstd(n);
  auto loss = [&] {
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
    return dot(y, r);
  };
  loss();
  std::vector<double> dx(n * c), dw(c, 0.0), db(c, 0.0);
  layernorm_backward_input(dx.data(), static_cast<const double*>(nullptr), r.data(), x.data(), mean.data(),
                           rstd.data(), w.data(), n, c);
  layernorm_backward_weight(dw.data(), db.data(), r.data(), x.data(), mean.data(), rstd.data(), n, c);
  EXPECT_LT(relative_gradient_error(x, dx, loss), kTolerance);
  EXPECT_LT(relative_gradient_error(w, dw, loss), kTolerance);
  EXPECT_LT(relative_gradient_error(b, db, loss), kTolerance);
  // With a residual gradient: dx = residual + ∂L/∂x (to rounding: one fused multiply-add).
  const auto residual = normal_vector(n * c, 15);
  std::vector<double> dx_fused(n * c);
  layernorm_backward_input(dx_fused.data(), residual.data(), r.data(), x.data(), mean.data(), rstd.data(), w.data(), n,
                           c);
  for (int i = 0; i < n * c; ++i) EXPECT_NEAR(dx_fused[i], residual[i] + dx[i], 1e-14) << i;
}

TEST(KernelGradient, GeluMatchesFiniteDifferences) {
  const int n = 41;
  auto x = normal_vector(n, 21, 2.0);
  const auto r = normal_vector(n, 22);
  std::vector<double> y(n);
  auto loss = [&] {
    gelu_forward(y.data(), x.data(), n);
    return dot(y, r);
  };
  std::vector<double> dx = r;
  gelu_backward(dx.data(), x.data(), n);
  EXPECT_LT(relative_gradient_error(x, dx, loss), kTolerance);
}

// t = 70 spans two query blocks of kAttentionBlock = 64, so the blocked
// causal products and the dk/dv accumulation across blocks are exercised;
// the scratch holds both sequences, so each product is one batch of both
// (their strides exercised in every precision), and dqkv starts as NaN (a
// product adding to it where it should set it fails).
TEST(KernelGradient, CausalAttentionMatchesFiniteDifferences) {
  const int b = 2, t = 70, c = 8, nh = 2;
  auto qkv = normal_vector(b * t * 3 * c, 31);
  const auto r = normal_vector(b * t * c, 32);
  std::vector<double> y(b * t * c), probs(b * nh * t * t);
  auto loss = [&] {
    attention_forward(y.data(), probs.data(), qkv.data(), b, t, c, nh, nh);
    return dot(y, r);
  };
  loss();
  std::vector<double> dqkv(qkv.size(), std::nan("")), scratch(b * attention_backward_scratch(1, t, nh));
  attention_backward(dqkv.data(), scratch.data(), static_cast<long>(scratch.size()), r.data(), probs.data(),
                     qkv.data(), b, t, c, nh, nh);
  EXPECT_LT(relative_gradient_error(qkv, dqkv, loss), kTolerance);
}

TEST(KernelGradient, AttentionIsCausalAndRowsSumToOne) {
  const int b = 1, t = 67, c = 4, nh = 1;
  auto qkv = normal_vector(b * t * 3 * c, 33);
  std::vector<double> y(b * t * c), probs(b * nh * t * t, -1.0);
  attention_forward(y.data(), probs.data(), qkv.data(), b, t, c, nh, nh);
  for (int row = 0; row < t; ++row) {
    double total = 0;
    for (int key = 0; key < t; ++key) {
      const double p = probs[row * t + key];
      if (key > row) {
        EXPECT_EQ(p, 0.0) << "row " << row << " key " << key;
      }
      total += p;
    }
    EXPECT_NEAR(total, 1.0, 1e-12) << "row " << row;
  }
  // The first position attends only to itself: its output is its own value.
  for (int j = 0; j < c; ++j) EXPECT_DOUBLE_EQ(y[j], qkv[2 * c + j]);
}

// A vision encoder's attention: every query sees every key, across both
// query blocks (both sequences one batch, as above).
TEST(KernelGradient, BidirectionalAttentionMatchesFiniteDifferences) {
  const int b = 2, t = 70, c = 8, nh = 2;
  auto qkv = normal_vector(b * t * 3 * c, 34);
  const auto r = normal_vector(b * t * c, 35);
  std::vector<double> y(b * t * c), probs(b * nh * t * t);
  auto loss = [&] {
    attention_forward(y.data(), probs.data(), qkv.data(), b, t, c, nh, nh, false);
    return dot(y, r);
  };
  loss();
  std::vector<double> dqkv(qkv.size(), std::nan("")), scratch(b * attention_backward_scratch(1, t, nh));
  attention_backward(dqkv.data(), scratch.data(), static_cast<long>(scratch.size()), r.data(), probs.data(),
                     qkv.data(), b, t, c, nh, nh, false);
  EXPECT_LT(relative_gradient_error(qkv, dqkv, loss), kTolerance);
}

// Without the mask the first query sees all t keys; the last query sees what
// it sees with the mask, so its row and output are the causal one's.
TEST(KernelGradient, BidirectionalAttentionSeesEveryKey) {
  const int b = 1, t = 67, c = 4, nh = 1;
  auto qkv = normal_vector(b * t * 3 * c, 36);
  std::vector<double> y(b * t * c), probs(b * nh * t * t), y_causal(y.size()), probs_causal(probs.size());
  attention_forward(y.data(), probs.data(), qkv.data(), b, t, c, nh, nh, false);
  attention_forward(y_causal.data(), probs_causal.data(), qkv.data(), b, t, c, nh, nh, true);
  double first_row = 0;
  for (int key = 0; key < t; ++key) {
    EXPECT_GT(probs[key], 0.0) << "key " << key;
    first_row += probs[key];
  }
  EXPECT_NEAR(first_row, 1.0, 1e-12);
  for (int key = 0; key < t; ++key) EXPECT_DOUBLE_EQ(probs[(t - 1) * t + key], probs_causal[(t - 1) * t + key]);
  for (int j = 0; j < c; ++j) EXPECT_DOUBLE_EQ(y[(t - 1) * c + j], y_causal[(t - 1) * c + j]);
}

TEST(KernelGradient, EmbeddingMatchesFiniteDifferences) {
  const int b = 2, t = 3, c = 5, v = 4;
  const std::vector<std::int32_t> tokens = {0, 3, 3, 1, 0, 2};
  auto wte = normal_vector(v * c, 41);
  auto wpe = normal_vector(t * c, 42);
  const auto r = normal_vector(b * t * c, 43);
  std::vector<double> x(b * t * c);
  auto loss = [&] {
    embedding_forward(x.data(), tokens.data(), wte.data(), wpe.data(), b, t, c);
    return dot(x, r);
  };
  std::vector<double> dwte(v * c, 0.0), dwpe(t * c, 0.0);
  embedding_backward_weight(dwte.data(), dwpe.data(), r.data(), tokens.data(), b, t, c);
  EXPECT_LT(relative_gradient_error(wte, dwte, loss), kTolerance);
  EXPECT_LT(relative_gradient_error(wpe, dwpe, loss), kTolerance);
}

TEST(KernelGradient, CrossEntropyMatchesFiniteDifferences) {
  const int n = 3, v = 19;
  auto logits = normal_vector(n * v, 51, 3.0);
  const std::vector<std::int32_t> targets = {4, 0, 18};
  std::vector<double> probs;
  auto loss = [&] {
    probs = logits;
    return softmax_cross_entropy_forward(probs.data(), targets.data(), n, v) / n;
  };
  loss();
  std::vector<double> dlogits = probs;
  softmax_cross_entropy_backward(dlogits.data(), targets.data(), 1.0 / n, n, v);
  EXPECT_LT(relative_gradient_error(logits, dlogits, loss), kTolerance);
}

TEST(KernelGradient, CrossEntropyOfUniformLogitsIsLogV) {
  const int n = 2, v = 256;
  std::vector<float> probs(n * v, 0.25f);
  const std::vector<std::int32_t> targets = {7, 200};
  const double loss = softmax_cross_entropy_forward(probs.data(), targets.data(), n, v);
  EXPECT_NEAR(loss / n, std::log(256.0), 1e-6);
  EXPECT_NEAR(probs[5], 1.0 / 256, 1e-9);
}

// The float kernels use a polynomial exp (and tanh through it); they must agree
// with the libm-based double kernels to float accuracy.
TEST(KernelPrecision, FloatGeluAttentionAndCrossEntropyAgreeWithDouble) {
  const int b = 1, t = 80, c = 16, nh = 2, v = 256;
  const auto qkv = normal_vector(b * t * 3 * c, 61, 2.0);
  std::vector<float> qkv_f(qkv.begin(), qkv.end());
  std::vector<double> y(b * t * c), probs(b * nh * t * t);
  std::vector<float> y_f(y.size()), probs_f(probs.size());
  attention_forward(y.data(), probs.data(), qkv.data(), b, t, c, nh, nh);
  attention_forward(y_f.data(), probs_f.data(), qkv_f.data(), b, t, c, nh, nh);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y_f[i], y[i], 2e-6 * (1 + std::abs(y[i]))) << i;

  const auto x = normal_vector(4096, 62, 4.0);
  std::vector<float> x_f(x.begin(), x.end()), g_f(x.size());
  std::vector<double> g(x.size());
  gelu_forward(g.data(), x.data(), static_cast<int>(x.size()));
  gelu_forward(g_f.data(), x_f.data(), static_cast<int>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(g_f[i], g[i], 2e-6 * (1 + std::abs(x[i]))) << x[i];
  // The slope too (dy = 1), over a length that leaves a partial last vector.
  const int odd = static_cast<int>(x.size()) - 3;
  std::vector<double> slope(x.size(), 1.0);
  std::vector<float> slope_f(x.size(), 1.0f);
  gelu_backward(slope.data(), x.data(), odd);
  gelu_backward(slope_f.data(), x_f.data(), odd);
  for (int i = 0; i < odd; ++i) EXPECT_NEAR(slope_f[i], slope[i], 2e-6 * (1 + std::abs(x[i]))) << x[i];
  for (std::size_t i = odd; i < x.size(); ++i) EXPECT_EQ(slope_f[i], 1.0f) << "past the end, at " << i;
  // Elementwise: an element's bits do not depend on where the array ends.
  std::vector<float> g_odd(x.size(), -7.0f);
  gelu_forward(g_odd.data(), x_f.data(), odd);
  for (int i = 0; i < odd; ++i) EXPECT_EQ(std::bit_cast<std::uint32_t>(g_odd[i]), std::bit_cast<std::uint32_t>(g_f[i]));
  for (std::size_t i = odd; i < x.size(); ++i) EXPECT_EQ(g_odd[i], -7.0f) << "past the end, at " << i;

  const auto logits = normal_vector(4 * v, 63, 3.0);
  std::vector<float> p_f(logits.begin(), logits.end());
  std::vector<double> p = logits;
  const std::vector<std::int32_t> targets = {0, 17, 255, 128};
  const double loss = softmax_cross_entropy_forward(p.data(), targets.data(), 4, v);
  const double loss_f = softmax_cross_entropy_forward(p_f.data(), targets.data(), 4, v);
  EXPECT_NEAR(loss_f, loss, 1e-5 * loss);
}

// The float LayerNorm input gradient (AVX-512 on such builds, the tail of a
// row in a masked vector) against the double one, with and without a
// residual, at a width that leaves a partial last vector and at 128.
TEST(KernelPrecision, FloatLayerNormInputGradientAgreesWithDouble) {
  for (const int c : {40, 128}) {
    const int n = 6;
    const auto x = normal_vector(n * c, 71, 3.0);
    const auto w = normal_vector(c, 72);
    const auto dy = normal_vector(n * c, 73);
    const auto residual = normal_vector(n * c, 74);
    const auto b = normal_vector(c, 75);
    std::vector<double> y(n * c), mean(n), rstd(n), dx(n * c);
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
    const std::vector<float> x_f(x.begin(), x.end()), w_f(w.begin(), w.end()), dy_f(dy.begin(), dy.end()),
        residual_f(residual.begin(), residual.end()), b_f(b.begin(), b.end());
    std::vector<float> y_f(n * c), mean_f(n), rstd_f(n), dx_f(n * c);
    layernorm_forward(y_f.data(), mean_f.data(), rstd_f.data(), x_f.data(), w_f.data(), b_f.data(), n, c);
    for (const bool with_residual : {false, true}) {
      layernorm_backward_input(dx.data(), with_residual ? residual.data() : nullptr, dy.data(), x.data(), mean.data(),
                               rstd.data(), w.data(), n, c);
      layernorm_backward_input(dx_f.data(), with_residual ? residual_f.data() : nullptr, dy_f.data(), x_f.data(),
                               mean_f.data(), rstd_f.data(), w_f.data(), n, c);
      for (int i = 0; i < n * c; ++i) {
        EXPECT_NEAR(dx_f[i], dx[i], 2e-5 * (1 + std::abs(dx[i]))) << "c " << c << ", residual " << with_residual << ", " << i;
      }
    }
  }
}

// A NaN input (weights gone bad) stays NaN through the polynomial exp, so
// the loss says so; it is never turned into a number (UBSan: converting NaN
// to an integer is undefined).
TEST(KernelPrecision, FloatGeluKeepsNaNAndInfinity) {
  const float nan = std::nanf("");
  const float in[] = {nan, -nan, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  float out[4];
  gelu_forward(out, in, 4);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], std::numeric_limits<float>::infinity());
  // −∞ / (1 + e^{+∞}): NaN where the exp reaches +∞ (AVX-512 builds), −∞
  // where the generic exp stops at e^88; never a finite number.
  EXPECT_FALSE(std::isfinite(out[3]));
}

#if defined(__AVX512F__)
// The AVX-512 exp (softmax and GELU on such builds) gives exp_approx's bits
// wherever exp_approx does not clamp, and past it the limits (0, +inf), NaN
// for NaN.
TEST(KernelPrecision, Avx512ExpGivesTheScalarPolynomialsBits) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.00173f) x.push_back(v);
  for (const float v : {-0.0f, 0.0f, 1e-30f, -1e-30f, 0.34657359f, -0.34657359f, 87.99f, -86.99f}) x.push_back(v);
  while (x.size() % detail::kLanes != 0) x.push_back(1.0f);
  alignas(64) float out[detail::kLanes];
  for (std::size_t i = 0; i < x.size(); i += detail::kLanes) {
    _mm512_store_ps(out, detail::exp16(_mm512_loadu_ps(x.data() + i)));
    for (int j = 0; j < detail::kLanes; ++j) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(out[j]), std::bit_cast<std::uint32_t>(detail::exp_approx(x[i + j])))
          << "x = " << x[i + j];
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  alignas(64) const float edge[detail::kLanes] = {-200.0f, -inf, 200.0f, inf, std::nanf(""), -104.0f, 89.0f, 0.0f,
                                                  0.0f,    0.0f, 0.0f,   0.0f, 0.0f,        0.0f,    0.0f,  0.0f};
  _mm512_store_ps(out, detail::exp16(_mm512_load_ps(edge)));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], inf);
  EXPECT_EQ(out[3], inf);
  EXPECT_TRUE(std::isnan(out[4]));
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_EQ(out[6], inf);
  EXPECT_EQ(out[7], 1.0f);
}
#endif

}  // namespace
}  // namespace pipeflow
