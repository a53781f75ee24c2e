// The fp16 loss scale, step by step against DeepSpeed's DynamicLossScaler
// (update_scale with its defaults: scale factor 2, non-consecutive hysteresis).

#include <gtest/gtest.h>

#include "pipeflow/runtime/loss_scaler.h"

namespace pipeflow::runtime {
namespace {

TEST(LossScaler, OverflowsSpendTheHysteresisThenHalveAndACleanWindowDoubles) {
  LossScaler scaler({.loss_scale = 0, .initial_scale_power = 4, .loss_scale_window = 3, .hysteresis = 2,
                     .min_loss_scale = 2});
  EXPECT_TRUE(scaler.dynamic());
  EXPECT_EQ(scaler.scale(), 16);
  scaler.update(true);  // iteration 0: one chance spent
  EXPECT_EQ(scaler.scale(), 16);
  scaler.update(true);  // 1: none left: halve
  EXPECT_EQ(scaler.scale(), 8);
  scaler.update(true);  // 2: still none left (restored only by a clean window)
  EXPECT_EQ(scaler.scale(), 4);
  scaler.update(false);  // 3, 4: clean, (iteration − last overflow) = 1, 2
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 4);
  scaler.update(false);  // 5: 3 clean steps since the overflow at 2: double, chances back
  EXPECT_EQ(scaler.scale(), 8);
  EXPECT_EQ(scaler.state().hysteresis_left, 2);
  scaler.update(true);  // 6: a chance spent
  EXPECT_EQ(scaler.scale(), 8);
  scaler.update(true);  // 7: halve
  scaler.update(true);  // 8: halve to the minimum
  EXPECT_EQ(scaler.scale(), 2);
  EXPECT_FALSE(scaler.can_lower());
  scaler.update(true);  // 9: stays at the minimum
  EXPECT_EQ(scaler.scale(), 2);
  EXPECT_EQ(scaler.state(), (LossScaler::State{.scale = 2, .hysteresis_left = 1, .last_overflow = 9, .iteration = 10}));
}

TEST(LossScaler, WithoutOverflowsTheScaleDoublesEveryWindow) {
  LossScaler scaler({.loss_scale = 0, .initial_scale_power = 0, .loss_scale_window = 4});
  for (int step = 0; step < 12; ++step) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 8);  // at iterations 3, 7 and 11
}

TEST(LossScaler, AStaticScaleNeverMovesAndCannotBeLowered) {
  LossScaler scaler({.loss_scale = 128});
  EXPECT_FALSE(scaler.dynamic());
  for (const bool overflow : {true, false, true}) scaler.update(overflow);
  EXPECT_EQ(scaler.scale(), 128);
  EXPECT_FALSE(scaler.can_lower());
}

TEST(LossScaler, RestoringAStateContinuesIt) {
  const LossScaleConfig config{.loss_scale = 0, .initial_scale_power = 10, .loss_scale_window = 2, .hysteresis = 1};
  LossScaler first(config);
  for (const bool overflow : {true, false, false, true, false}) first.update(overflow);
  LossScaler resumed(config);
  resumed.restore(first.state());
  first.update(false);
  resumed.update(false);
  EXPECT_EQ(resumed.state(), first.state());
}

}  // namespace
}  // namespace pipeflow::runtime
