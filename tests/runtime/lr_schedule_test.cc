#include <gtest/gtest.h>

#include <string>

#include "pipeflow/config/run_config.h"
#include "pipeflow/nn/lr_schedule.h"
#include "pipeflow/runtime/run_settings.h"

namespace pipeflow::runtime {
namespace {

// DeepSpeed's scheduler section as the run configuration reads it, the
// schedule the runtime projects from it (nn::LrSchedule's arithmetic).
nn::LrSchedule schedule(const std::string& json, double optimizer_lr = 1e-3) {
  return lr_schedule(parse_run_config(Config::parse(json, "ds.json")).scheduler, optimizer_lr);
}

TEST(LrSchedule, WarmupLRFollowsDeepSpeedsLogAndLinearWarmup) {
  const auto log = schedule(
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 100}}})");
  EXPECT_EQ(log.lr(0), 0.0);
  EXPECT_NEAR(log.lr(9), 0.0005, 1e-15);  // ln 10 / ln 100 = 1/2
  EXPECT_EQ(log.lr(100), 0.001);
  EXPECT_EQ(log.lr(5000), 0.001);
  const auto linear = schedule(
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.002, "warmup_num_steps": 100, "warmup_type": "linear"}}})");
  EXPECT_NEAR(linear.lr(25), 0.0005, 1e-15);
  // DeepSpeed floors warmup_num_steps at 2 (ln W must be positive): 0 and 1 warm up over steps 0 and 1.
  for (const char* steps : {"0", "1"}) {
    const auto short_warmup = schedule(std::string(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": )"
                                                   R"(0.0001, "warmup_max_lr": 0.001, "warmup_num_steps": )") +
                                       steps + "}}}");
    EXPECT_EQ(short_warmup.lr(0), 0.0001) << steps;
    EXPECT_DOUBLE_EQ(short_warmup.lr(1), 0.001) << steps;
    EXPECT_DOUBLE_EQ(short_warmup.lr(2), 0.001) << steps;
  }
}

TEST(LrSchedule, WarmupDecayLRDecaysLinearlyAfterWarmup) {
  const auto s = schedule(
      R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 1000, "warmup_max_lr": 0.001, "warmup_num_steps": 100}}})");
  EXPECT_EQ(s.lr(100), 0.001);
  EXPECT_NEAR(s.lr(550), 0.0005, 1e-15);
  EXPECT_EQ(s.lr(1000), 0.0);
  EXPECT_EQ(s.lr(1500), 0.0);
}

TEST(LrSchedule, WarmupCosineLRIsARatioOfTheOptimizersLr) {
  const auto s = schedule(
      R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1100, "warmup_num_steps": 100, "warmup_type": "linear", "warmup_min_ratio": 0.1, "cos_min_ratio": 0.0}}})",
      6e-4);
  EXPECT_NEAR(s.lr(0), 6e-5, 1e-18);
  EXPECT_NEAR(s.lr(50), 6e-4 * (0.1 + 0.9 * 0.5), 1e-18);
  EXPECT_NEAR(s.lr(599), 3e-4, 1e-15);  // halfway through the cosine: (1 + cos π/2)/2
  EXPECT_NEAR(s.lr(1099), 0.0, 1e-18);
  EXPECT_EQ(schedule("{}", 6e-4).lr(7), 6e-4);
}

}  // namespace
}  // namespace pipeflow::runtime
