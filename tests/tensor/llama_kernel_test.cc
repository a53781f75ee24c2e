// Llama's kernels: RMSNorm, the rotary embedding, SwiGLU, nn.Linear-layout
// projections and grouped-query attention, each backward against central
// differences in double precision (L = Σ out ⊙ R, so ∂L/∂out = R), and the
// forwards against their closed forms.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../support/error_of.h"
#include "finite_difference.h"
#include "pipeflow/tensor/attention.h"
#include "pipeflow/tensor/gemm.h"
#include "pipeflow/tensor/linear.h"
#include "pipeflow/tensor/rmsnorm.h"
#include "pipeflow/tensor/rope.h"
#include "pipeflow/tensor/swiglu.h"

namespace pipeflow {
namespace {

using testing::dot;
using testing::normal_vector;
using testing::relative_gradient_error;

constexpr double kTolerance = 1e-7;

TEST(LlamaKernel, RmsNormIsXOverItsRootMeanSquareTimesTheGain) {
  const std::vector<double> x = {3, 4};  // mean of squares 12.5
  const std::vector<double> w = {2, 0.5};
  std::vector<double> y(2), rstd(1);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), 0.5, 1, 2);
  EXPECT_DOUBLE_EQ(rstd[0], 1 / std::sqrt(13.0));
  EXPECT_DOUBLE_EQ(y[0], 3 / std::sqrt(13.0) * 2);
  EXPECT_DOUBLE_EQ(y[1], 4 / std::sqrt(13.0) * 0.5);
}

TEST(LlamaKernel, RmsNormMatchesFiniteDifferences) {
  const int n = 4, c = 37;  // c not a multiple of the 16 reduction lanes
  auto x = normal_vector(n * c, 1, 2.0);
  auto w = normal_vector(c, 2);
  const auto r = normal_vector(n * c, 3);
  std::vector<double> y(n * c), rstd(n);
  auto loss = [&] {
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), 1e-5, n, c);
    return dot(y, r);
  };
  loss();
  std::vector<double> dx(n * c), dw(c, 0.0);
  rmsnorm_backward_input(dx.data(), static_cast<const double*>(nullptr), r.data(), x.data(), rstd.data(), w.data(),
                         n, c);
  rmsnorm_backward_weight(dw.data(), r.data(), x.data(), rstd.data(), n, c);
  EXPECT_LT(relative_gradient_error(x, dx, loss), kTolerance);
  EXPECT_LT(relative_gradient_error(w, dw, loss), kTolerance);
  // With the residual gradient fused in, in place.
  const auto residual = normal_vector(n * c, 4);
  std::vector<double> fused = residual;
  rmsnorm_backward_input(fused.data(), fused.data(), r.data(), x.data(), rstd.data(), w.data(), n, c);
  for (int i = 0; i < n * c; ++i) EXPECT_NEAR(fused[i], residual[i] + dx[i], 1e-14) << i;
}

// The closed form: feature i and i + hs/2 of a head at position p turn by
// p·f_i, so a unit vector on feature i becomes (cos p·f_i, sin p·f_i).
TEST(LlamaKernel, RopeTurnsEachPairByPositionTimesFrequency) {
  const int hs = 8, half = 4, positions = 1000;
  std::vector<double> frequencies(half);
  for (int i = 0; i < half; ++i) frequencies[i] = std::pow(10000.0, -2.0 * i / hs);
  std::vector<double> cos_table(positions * half), sin_table(positions * half);
  rope_table(cos_table.data(), sin_table.data(), frequencies.data(), positions, half);
  for (const int position : {0, 1, 7, 500, 999}) {
    for (int i = 0; i < half; ++i) {
      std::vector<double> x(hs, 0.0);
      x[i] = 1;
      rope_rotate(x.data(), hs, 1, position, 1, hs, cos_table.data(), sin_table.data(), RopeDirection::kForward);
      const double angle = position * frequencies[i];
      EXPECT_NEAR(x[i], std::cos(angle), 1e-15) << position << " " << i;
      EXPECT_NEAR(x[i + half], std::sin(angle), 1e-15) << position << " " << i;
      for (int j = 0; j < hs; ++j) {
        if (j != i && j != i + half) {
          EXPECT_EQ(x[j], 0.0);
        }
      }
    }
  }
  // Attention scores depend only on the distance: <R(p)q, R(p+d)k> = <q, R(d)k>.
  const auto q = normal_vector(hs, 5);
  const auto k = normal_vector(hs, 6);
  auto rotated = [&](std::vector<double> v, int position) {
    rope_rotate(v.data(), hs, 1, position, 1, hs, cos_table.data(), sin_table.data(), RopeDirection::kForward);
    return v;
  };
  EXPECT_NEAR(dot(rotated(q, 300), rotated(k, 305)), dot(q, rotated(k, 5)), 1e-12);
}

TEST(LlamaKernel, RopeInverseIsTheBackwardAndUndoesTheForward) {
  const int rows = 5, heads = 3, hs = 6, ld = 20, positions = 16;  // ld > heads·hs: a column block
  std::vector<double> frequencies = {1.0, 0.1, 0.01};
  std::vector<double> cos_table(positions * 3), sin_table(positions * 3);
  rope_table(cos_table.data(), sin_table.data(), frequencies.data(), positions, 3);
  auto x = normal_vector(rows * ld, 7);
  const auto r = normal_vector(rows * ld, 8);
  auto loss = [&] {
    std::vector<double> y = x;
    rope_rotate(y.data(), ld, rows, 4, heads, hs, cos_table.data(), sin_table.data(), RopeDirection::kForward);
    return dot(y, r);
  };
  std::vector<double> dx = r;
  rope_rotate(dx.data(), ld, rows, 4, heads, hs, cos_table.data(), sin_table.data(), RopeDirection::kInverse);
  EXPECT_LT(relative_gradient_error(x, dx, loss), kTolerance);
  std::vector<double> y = x;
  rope_rotate(y.data(), ld, rows, 4, heads, hs, cos_table.data(), sin_table.data(), RopeDirection::kForward);
  rope_rotate(y.data(), ld, rows, 4, heads, hs, cos_table.data(), sin_table.data(), RopeDirection::kInverse);
  for (int i = 0; i < rows * ld; ++i) EXPECT_NEAR(y[i], x[i], 1e-14) << i;
}

TEST(LlamaKernel, SwigluMatchesItsFormulaAndFiniteDifferences) {
  const int n = 3, f = 21;
  auto gu = normal_vector(n * 2 * f, 9, 2.0);
  const auto r = normal_vector(n * f, 10);
  std::vector<double> a(n * f);
  auto loss = [&] {
    swiglu_forward(a.data(), gu.data(), n, f);
    return dot(a, r);
  };
  loss();
  const double gate = gu[2 * f + 5], up = gu[2 * f + f + 5];
  EXPECT_NEAR(a[f + 5], gate / (1 + std::exp(-gate)) * up, 1e-15);
  std::vector<double> dgu(n * 2 * f);
  swiglu_backward(dgu.data(), r.data(), gu.data(), n, f);
  EXPECT_LT(relative_gradient_error(gu, dgu, loss), kTolerance);

  // The float kernels (AVX-512 on such builds; f = 21 leaves a partial last
  // vector in each row) against the double ones, forward and backward.
  loss();  // a at gu as given (the finite differences moved it)
  const std::vector<float> gu_f(gu.begin(), gu.end()), r_f(r.begin(), r.end());
  std::vector<float> a_f(n * f), dgu_f(n * 2 * f);
  swiglu_forward(a_f.data(), gu_f.data(), n, f);
  swiglu_backward(dgu_f.data(), r_f.data(), gu_f.data(), n, f);
  for (int i = 0; i < n * f; ++i) EXPECT_NEAR(a_f[i], a[i], 2e-6 * (1 + std::abs(a[i]))) << i;
  for (int i = 0; i < n * 2 * f; ++i) EXPECT_NEAR(dgu_f[i], dgu[i], 2e-6 * (1 + std::abs(dgu[i]))) << i;
}

// Two projections side by side in one output (as q | k | v), the second with
// a residual, through the nn.Linear layout [out, in].
TEST(LlamaKernel, ProjectionsIntoColumnBlocksMatchFiniteDifferences) {
  const int n = 4, in = 6, out1 = 5, out2 = 3, ld = out1 + out2;
  auto x = normal_vector(n * in, 11);
  auto w1 = normal_vector(out1 * in, 12);
  auto w2 = normal_vector(out2 * in, 13);
  const auto r = normal_vector(n * ld, 14);
  std::vector<double> y(n * ld);
  auto loss = [&] {
    projection_forward(y.data(), ld, x.data(), w1.data(), static_cast<const double*>(nullptr), n, in, out1);
    projection_forward(y.data() + out1, ld, x.data(), w2.data(), static_cast<const double*>(nullptr), n, in, out2);
    return dot(y, r);
  };
  loss();
  EXPECT_NEAR(y[ld + 2], dot(std::vector<double>(x.begin() + in, x.begin() + 2 * in),
                             std::vector<double>(w1.begin() + 2 * in, w1.begin() + 3 * in)),
              1e-14);
  std::vector<double> dx(n * in), dw1(out1 * in, 0.0), dw2(out2 * in, 0.0);
  projection_backward_input(dx.data(), r.data(), ld, w1.data(), n, in, out1, false);
  projection_backward_input(dx.data(), r.data() + out1, ld, w2.data(), n, in, out2, true);
  projection_backward_weight(dw1.data(), x.data(), r.data(), ld, n, in, out1);
  projection_backward_weight(dw2.data(), x.data(), r.data() + out1, ld, n, in, out2);
  EXPECT_LT(relative_gradient_error(x, dx, loss), kTolerance);
  EXPECT_LT(relative_gradient_error(w1, dw1, loss), kTolerance);
  EXPECT_LT(relative_gradient_error(w2, dw2, loss), kTolerance);

  const auto residual = normal_vector(n * in, 15);
  std::vector<double> z(n * in), expected(n * in);
  projection_forward(z.data(), in, y.data(), std::vector<double>(in * ld, 0.5).data(), residual.data(), n, ld, in);
  projection_forward(expected.data(), in, y.data(), std::vector<double>(in * ld, 0.5).data(),
                     static_cast<const double*>(nullptr), n, ld, in);
  for (int i = 0; i < n * in; ++i) EXPECT_NEAR(z[i], expected[i] + residual[i], 1e-13);
}

// Grouped-query attention over 2 sequences of t = 70 (two query blocks; both
// sequences one batch, dqkv starting as NaN), 4 query heads on 1 and 2
// key/value heads (multi-head attention: kernel_gradient_test.cc).
TEST(LlamaKernel, GroupedQueryAttentionMatchesFiniteDifferences) {
  const int b = 2, t = 70, nh = 4, hs = 2, c = nh * hs;
  for (const int kv : {1, 2}) {
    const int w = (nh + 2 * kv) * hs;
    auto qkv = normal_vector(b * t * w, 16 + kv);
    const auto r = normal_vector(b * t * c, 20 + kv);
    std::vector<double> y(b * t * c), probs(b * nh * t * t);
    auto loss = [&] {
      attention_forward(y.data(), probs.data(), qkv.data(), b, t, c, nh, kv);
      return dot(y, r);
    };
    loss();
    std::vector<double> dqkv(qkv.size(), std::nan("")), scratch(b * attention_backward_scratch(1, t, nh));
    attention_backward(dqkv.data(), scratch.data(), static_cast<long>(scratch.size()), r.data(), probs.data(),
                       qkv.data(), b, t, c, nh, kv);
    EXPECT_LT(relative_gradient_error(qkv, dqkv, loss), kTolerance) << kv << " key/value heads";
  }
}

// The float attention, its GEMMs in fp32 and in bf16 (the batched oneDNN
// matmul), against the double one: grouped-query attention over 7
// sequences of t = 80 (two query blocks; under bf16 batches of 3, 3 and 1
// sequences, under fp32 of one).
// fp32: float rounding, 1e-5 relative. bf16: every product's operands
// rounded to bf16 (2^-9 relative), summed over up to 80 keys, 2e-2; and
// visibly moved from fp32 (more than 1e-4), or the bf16 path did not run.
TEST(LlamaKernel, FloatAttentionInFp32AndBf16AgreesWithDouble) {
  const int b = 7, t = 80, nh = 4, kv = 2, hs = 4, c = nh * hs, w = (nh + 2 * kv) * hs;
  const auto qkv = normal_vector(b * t * w, 40);
  const auto r = normal_vector(b * t * c, 41);
  std::vector<double> y(b * t * c), probs(b * nh * t * t), dqkv(qkv.size()),
      scratch(attention_backward_scratch(b, t, nh));
  attention_forward(y.data(), probs.data(), qkv.data(), b, t, c, nh, kv);
  attention_backward(dqkv.data(), scratch.data(), static_cast<long>(scratch.size()), r.data(), probs.data(),
                     qkv.data(), b, t, c, nh, kv);
  for (const GemmPrecision precision : {GemmPrecision::kFp32, GemmPrecision::kBf16}) {
    if (precision == GemmPrecision::kBf16 && !bf16_matmul_available()) {
      GTEST_SKIP() << "the bf16 half: oneDNN has no bf16 matmul on this CPU (AVX2 alone); the fp32 half passed";
    }
    SCOPED_TRACE(to_string(precision));
    const GemmPrecisionScope scope(precision);
    const std::vector<float> qkv_f(qkv.begin(), qkv.end()), r_f(r.begin(), r.end());
    std::vector<float> y_f(y.size()), probs_f(probs.size()), dqkv_f(dqkv.size()),
        scratch_f(attention_backward_scratch(b, t, nh));
    attention_forward(y_f.data(), probs_f.data(), qkv_f.data(), b, t, c, nh, kv);
    attention_backward(dqkv_f.data(), scratch_f.data(), static_cast<long>(scratch_f.size()), r_f.data(),
                       probs_f.data(), qkv_f.data(), b, t, c, nh, kv);
    const double bound = precision == GemmPrecision::kFp32 ? 1e-5 : 2e-2;
    double moved = 0;
    const auto expect_near = [&](const std::vector<float>& got, const std::vector<double>& want, const char* what) {
      for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], bound * (1 + std::abs(want[i]))) << what << " " << i;
        moved = std::max(moved, std::abs(got[i] - want[i]));
      }
    };
    expect_near(y_f, y, "y");
    expect_near(dqkv_f, dqkv, "dqkv");
    if (precision == GemmPrecision::kBf16) {
      EXPECT_GT(moved, 1e-4);
    }
    // One sequence's row-block scores for every head: 4 · 64 · 80.
    EXPECT_EQ(scratch_f.size(), precision == GemmPrecision::kBf16 ? 3u * 20480 : 20480u);
    EXPECT_EQ(testing::error_of([&] {
                attention_backward(dqkv_f.data(), scratch_f.data(), 20479, r_f.data(), probs_f.data(), qkv_f.data(),
                                   b, t, c, nh, kv);
              }),
              "internal: attention_backward's scratch holds 20479 elements, fewer than one sequence's 20480 (t 80, "
              "4 heads): size it by attention_backward_scratch");
  }
}

// No positions, or no sequences: nothing to compute, nothing written, and
// no scratch asked for.
TEST(LlamaKernel, AttentionOverNoPositionsDoesNothing) {
  std::vector<double> y(4, 7.0), probs(4, 7.0), qkv(4, 1.0), dqkv(4, 7.0), dy(4, 1.0);
  for (const int t : {0, 3}) {
    const int b = t == 0 ? 2 : 0;
    EXPECT_EQ(attention_backward_scratch(b, t, 2), 0);
    attention_forward(y.data(), probs.data(), qkv.data(), b, t, 4, 2, 1);
    attention_backward(dqkv.data(), static_cast<double*>(nullptr), 0, dy.data(), probs.data(), qkv.data(), b, t, 4, 2,
                       1);
  }
  EXPECT_EQ(y, std::vector<double>(4, 7.0));
  EXPECT_EQ(dqkv, std::vector<double>(4, 7.0));
}

// GQA is multi-head attention with each key/value head repeated for its
// group: the same outputs as MHA on the expanded qkv, and the same as the
// cached path row by row.
TEST(LlamaKernel, GroupedQueryAttentionEqualsRepeatedHeadsAndTheCachedPath) {
  const int t = 9, nh = 4, kv = 2, hs = 2, c = nh * hs, w = (nh + 2 * kv) * hs, kvw = kv * hs;
  const auto qkv = normal_vector(t * w, 30);
  std::vector<double> expanded(t * 3 * c);
  for (int row = 0; row < t; ++row) {
    for (int head = 0; head < nh; ++head) {
      for (int j = 0; j < hs; ++j) {
        const int group_head = head / (nh / kv);
        expanded[row * 3 * c + head * hs + j] = qkv[row * w + head * hs + j];
        expanded[row * 3 * c + c + head * hs + j] = qkv[row * w + c + group_head * hs + j];
        expanded[row * 3 * c + 2 * c + head * hs + j] = qkv[row * w + c + kvw + group_head * hs + j];
      }
    }
  }
  std::vector<double> y(t * c), y_mha(t * c), probs(nh * t * t);
  attention_forward(y.data(), probs.data(), qkv.data(), 1, t, c, nh, kv);
  attention_forward(y_mha.data(), probs.data(), expanded.data(), 1, t, c, nh, nh);
  for (int i = 0; i < t * c; ++i) EXPECT_NEAR(y[i], y_mha[i], 1e-14) << i;

  std::vector<double> keys(t * kvw), values(t * kvw), y_cached(t * c), scores(t * t);
  for (int row = 0; row < t; ++row) {
    for (int j = 0; j < kvw; ++j) {
      keys[row * kvw + j] = qkv[row * w + c + j];
      values[row * kvw + j] = qkv[row * w + c + kvw + j];
    }
  }
  attention_forward_cached(y_cached.data(), scores.data(), qkv.data() + 3 * w, w, keys.data(), values.data(), t - 3,
                           3, c, nh, kv);
  for (int i = 0; i < (t - 3) * c; ++i) EXPECT_NEAR(y_cached[i], y[3 * c + i], 1e-14) << i;
}

}  // namespace
}  // namespace pipeflow
