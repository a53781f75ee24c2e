#include "pipeflow/plan/advise_batch.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "pipeflow/core/file.h"

#include "../support/error_of.h"
#include "../support/temp_dir.h"

namespace pipeflow {
namespace {

using testing::error_of;

BatchAdviceRequest request(long long base_batch, double base_lr, long long warmup, long long target_batch) {
  BatchAdviceRequest r;
  r.base_batch = base_batch;
  r.base_lr = base_lr;
  r.base_warmup_steps = warmup;
  r.target_batch = target_batch;
  return r;
}

// Goyal et al. 2017's ImageNet recipe: batch 256 at 0.1, 8192 at 3.2.
TEST(AdviseBatch, SgdScalesLinearlyAndKeepsTheWarmupsSamples) {
  BatchAdviceRequest sgd = request(256, 0.1, 3200, 8192);
  sgd.optimizer = OptimizerFamily::kSgd;
  const BatchAdvice advice = advise_batch(sgd);
  EXPECT_DOUBLE_EQ(advice.scale, 32);
  EXPECT_DOUBLE_EQ(advice.lr, 3.2);
  EXPECT_EQ(advice.warmup_steps, 100);
  EXPECT_EQ(advice.rule, "linear scaling with warmup (Goyal et al. 2017)");
}

// Adam: lr · √k; a batch 4x larger doubles the rate.
TEST(AdviseBatch, AdamScalesByTheSquareRoot) {
  const BatchAdvice advice = advise_batch(request(512, 6e-4, 2000, 2048));
  EXPECT_DOUBLE_EQ(advice.lr, 1.2e-3);
  EXPECT_EQ(advice.warmup_steps, 500);
  EXPECT_EQ(advice.rule, "square-root scaling (Malladi et al. 2022)");
  ASSERT_EQ(advice.warnings.size(), 1u);  // the critical batch is unknown
  EXPECT_NE(advice.warnings[0].find("critical batch size is unknown"), std::string::npos);
}

// McCandlish et al. 2018: S/S_min = 1 + B_noise/B, E/E_min = 1 + B/B_noise.
TEST(AdviseBatch, PastTheNoiseScaleWarnsWithTheSamplesItWastes) {
  BatchAdviceRequest past = request(256, 1e-4, 100, 4096);
  past.noise_scale = 1024;
  const BatchAdvice advice = advise_batch(past);
  EXPECT_DOUBLE_EQ(*advice.steps_over_minimum, 1.25);
  EXPECT_DOUBLE_EQ(*advice.samples_over_minimum, 5);
  ASSERT_EQ(advice.warnings.size(), 1u);
  EXPECT_NE(advice.warnings[0].find("past the critical batch size (gradient noise scale 1024"), std::string::npos)
      << advice.warnings[0];
  BatchAdviceRequest near = request(256, 1e-4, 100, 512);
  near.noise_scale = 1024;
  const BatchAdvice within = advise_batch(near);
  EXPECT_TRUE(within.warnings.empty());
}

TEST(AdviseBatch, BadInputNamesTheOption) {
  EXPECT_EQ(error_of([] { advise_batch(request(0, 1e-4, 0, 8)); }),
            "--base-batch 0: must be >= 1 sequence");
  EXPECT_EQ(error_of([] { advise_batch(request(8, -1, 0, 8)); }),
            "--base-lr -1: must be a positive learning rate (the one the base batch trains well with)");
  EXPECT_EQ(error_of([] { parse_optimizer_family("lamb"); }),
            "optimizer \"lamb\": use adam (Adam, AdamW: the square-root rule) or sgd (SGD with momentum: the linear "
            "rule)");
}

std::filesystem::path metrics_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::path(pipeflow::testing::make_temp_dir()) / (name + ".jsonl");
  write_file_atomic(path, text);
  return path;
}

// pipeflow train logs the smoothed noise scale on the steps that measure it.
TEST(AdviseBatchMetrics, ReadsTheLastNoiseScale) {
  const auto path = metrics_file("good", R"({"step": 0, "loss": 5.5, "noise_scale": 300.5}
{"step": 1, "loss": 5.4}
{"step": 2, "loss": 5.3, "grad_square_small": 2.0, "grad_square_big": 1.0, "noise_scale": 412.25}
{"step": 3, "loss": 5.2}
)");
  EXPECT_DOUBLE_EQ(noise_scale_of_metrics(path), 412.25);
}

TEST(AdviseBatchMetrics, AMissingOrGarbledFileNamesTheFileAndTheKey) {
  const auto missing = std::filesystem::path(pipeflow::testing::make_temp_dir()) / "no_such_metrics.jsonl";
  const std::string gone = error_of([&] { noise_scale_of_metrics(missing); });
  EXPECT_NE(gone.find("--metrics " + missing.string() + ": "), std::string::npos) << gone;
  EXPECT_NE(gone.find("\"noise_scale\""), std::string::npos) << gone;

  const auto garbled = metrics_file("garbled", "{\"step\": 0, \"noise_scale\": 3}\n{\"step\": 1, \"noi\n");
  const std::string bad = error_of([&] { noise_scale_of_metrics(garbled); });
  EXPECT_NE(bad.find(garbled.string() + " line 2"), std::string::npos) << bad;
  EXPECT_NE(bad.find("\"noise_scale\""), std::string::npos) << bad;

  const auto without = metrics_file("without", "{\"step\": 0, \"loss\": 5}\n");
  EXPECT_EQ(error_of([&] { noise_scale_of_metrics(without); }),
            without.string() + ": no line has \"noise_scale\" (the gradient noise scale pipeflow train measures): "
                               "train with metrics.noise_scale_interval >= 1 and more than one micro-batch per step, "
                               "or pass --noise-scale");

  const auto negative = metrics_file("negative", "{\"step\": 0, \"noise_scale\": 5}\n{\"step\": 1, \"noise_scale\": -4}\n");
  EXPECT_EQ(error_of([&] { noise_scale_of_metrics(negative); }),
            negative.string() + " line 2: \"noise_scale\" = -4: must be a positive number of sequences (B_simple); "
                                "the estimate is noisy over few steps: train longer, or pass --noise-scale");
  // A first step's negative estimate that settles is no error: the last value counts.
  const auto settles = metrics_file("settles", "{\"step\": 0, \"noise_scale\": -0.15}\n{\"step\": 1, \"noise_scale\": 0.17}\n");
  EXPECT_EQ(noise_scale_of_metrics(settles), 0.17);
}

}  // namespace
}  // namespace pipeflow
