// The gradient noise scale: McCandlish et al. 2018's two-batch estimates in
// closed form, and the engine's squared norms of one micro-batch's and of the
// global batch's gradient against the unpipelined model's.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "pipeflow/runtime/noise_scale.h"
#include "pipeflow/schedule/generators.h"
#include "test_support.h"

namespace pipeflow::runtime {
namespace {

// A gradient with |G|² = 1 and tr(Σ) = 8 has E|G_B|² = |G|² + tr(Σ)/B:
// 5 at B = 2, 2 at B = 8; the estimates give both back, B_simple = 8.
TEST(NoiseScale, TheTwoBatchEstimatesRecoverTheSignalAndTheNoise) {
  const NoiseScaleSample sample = noise_scale_sample(5, 2, 2, 8);
  EXPECT_DOUBLE_EQ(sample.grad_square, 1);
  EXPECT_DOUBLE_EQ(sample.trace, 8);
  NoiseScaleAverage average;
  EXPECT_FALSE(average.value());
  average.add(sample);
  EXPECT_DOUBLE_EQ(*average.value(), 8);
}

// Each estimate is averaged on its own, the ratio taken after: (0.9·0.1·8 +
// 0.1·30) / (0.9·0.1·1 + 0.1·2), not the mean of 8 and 15.
TEST(NoiseScale, AveragesNumeratorAndDenominatorApart) {
  NoiseScaleAverage average;
  average.add({.grad_square = 1, .trace = 8});
  average.add({.grad_square = 2, .trace = 30});
  EXPECT_EQ(average.samples(), 2);
  EXPECT_NEAR(*average.value(), (0.9 * 0.1 * 8 + 0.1 * 30) / (0.9 * 0.1 * 1 + 0.1 * 2), 1e-14);
  // Noise can make the averaged |G|² negative: no estimate then.
  average.add({.grad_square = -20, .trace = 1});
  EXPECT_FALSE(average.value());
}

TEST(NoiseScale, RefusesBatchesThatAreNotSmallAndBig) {
  EXPECT_THROW(noise_scale_sample(1, 8, 1, 8), Error);
  EXPECT_THROW(noise_scale_sample(1, 0, 1, 8), Error);
  EXPECT_THROW(noise_scale_sample(std::nan(""), 2, 1, 8), Error);
}

TEST(NoiseScale, MeasuresEveryIntervalthStepFromStepZero) {
  EXPECT_TRUE(measures_noise_scale(0, 3));
  EXPECT_FALSE(measures_noise_scale(1, 3));
  EXPECT_TRUE(measures_noise_scale(6, 3));
  EXPECT_FALSE(measures_noise_scale(0, 0));
}

TEST(NoiseScale, TheMicrobatchEveryStageCompletesFirst) {
  EXPECT_EQ(noise_microbatch(make_schedule("1f1b", 4, 8), 1).microbatch, 0);
  EXPECT_EQ(noise_microbatch(make_schedule("zb-h1", 4, 8), 1).microbatch, 0);
  EXPECT_EQ(noise_microbatch(make_schedule("looped-bfs", 2, 4, 2), 1).microbatch, 3);  // backwards in reverse
  const NoiseMicrobatch one = noise_microbatch(make_schedule("1f1b", 1, 1), 1);
  EXPECT_FALSE(one.microbatch);
  EXPECT_NE(one.obstacle.find("one micro-batch"), std::string::npos) << one.obstacle;
  EXPECT_EQ(noise_microbatch(make_schedule("1f1b", 1, 1), 2).microbatch, 0);  // replicas are the big batch
}

// The gradient of the mean loss over micro-batch j alone, of the unpipelined model.
double microbatch_square(std::int64_t step, int j) {
  nn::Stage model(testing::kTiny, nn::all_layers(testing::kTiny));
  model.init_parameters(11);
  nn::Batch batch = testing::tiny_dataset().batch(nn::Split::kTrain, step, static_cast<std::int64_t>(j) *
                                                                             testing::kMicroBatch,
                                                  testing::kMicroBatch);
  nn::MicrobatchState state;
  model.forward(state, {.tokens = std::move(batch.inputs), .targets = std::move(batch.targets)});
  model.backward_from_loss(state, 1.0);
  return model.gradient_square_sum();
}

void check_layout(const std::string& name, int ranks, int microbatches, int chunks, RunMode run) {
  const Schedule schedule = make_schedule(name, ranks, microbatches, chunks);
  SCOPED_TRACE(fmt::format("{} p={} m={} v={} {}", name, ranks, microbatches, chunks,
                           run == RunMode::kThreaded ? "threaded" : "serial"));
  EngineOptions options = testing::tiny_options();
  options.noise_scale_interval = 1;
  PipelineEngine engine(testing::kTiny, schedule,
                        partition_uniform(testing::kTiny.pipeline_layers(), schedule.num_stages()), options);
  engine.init_parameters(11);
  const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
  const StepResult result = engine.step(0, source, StepMode::kGradientsOnly, run);

  testing::Reference unpipelined(microbatches * testing::kMicroBatch);
  unpipelined.step(0, false);
  const double big = unpipelined.model().gradient_square_sum();
  EXPECT_LE(std::abs(result.grad_norm * result.grad_norm - big), 1e-5 * big);
  ASSERT_TRUE(result.grad_square_small);
  const double small = microbatch_square(0, *noise_microbatch(schedule, 1).microbatch);
  EXPECT_LE(std::abs(*result.grad_square_small - small), 1e-5 * small);
  EXPECT_GT(small, big);  // one micro-batch's gradient is the noisier
}

// 1F1B (B whole), ZB-H1 (B split into I then W: a stage's gradient is
// complete at its W), the tied wte across ranks, on one rank (ZBV's V), in
// one stage, and looped BFS's reversed backwards.
TEST(NoiseScale, TheSmallAndBigSquaresEqualTheUnpipelinedModels) {
  for (const RunMode run : {RunMode::kThreaded, RunMode::kSerial}) {
    check_layout("1f1b", 2, 4, 1, run);
    check_layout("1f1b", 4, 4, 1, run);
    check_layout("zb-h1", 2, 4, 1, run);
    check_layout("zb-h1", 3, 5, 1, run);
    check_layout("zbv", 2, 4, 2, run);
    check_layout("looped-bfs", 2, 4, 2, run);
    check_layout("gpipe", 1, 3, 1, run);
  }
}

TEST(NoiseScale, StepsBetweenMeasurementsReportNone) {
  EngineOptions options = testing::tiny_options();
  options.noise_scale_interval = 2;
  const Schedule schedule = make_schedule("1f1b", 2, 4);
  PipelineEngine engine(testing::kTiny, schedule, partition_uniform(testing::kTiny.pipeline_layers(), 2), options);
  engine.init_parameters(11);
  const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
  EXPECT_TRUE(engine.step(0, source).grad_square_small);
  EXPECT_FALSE(engine.step(1, source).grad_square_small);
  EXPECT_TRUE(engine.step(2, source).grad_square_small);
}

// Measuring reads the gradients and changes nothing: the weights after
// three steps are the same bits with and without it, for split backwards
// and the tied wte on one rank too.
TEST(NoiseScale, MeasuringLeavesTheTrainingBitForBit) {
  for (const auto& [name, chunks] : {std::pair{"zb-h1", 1}, std::pair{"zbv", 2}}) {
    const Schedule schedule = make_schedule(name, 2, 4, chunks);
    std::vector<std::vector<float>> weights;
    for (const int interval : {0, 1}) {
      EngineOptions options = testing::tiny_options();
      options.noise_scale_interval = interval;
      PipelineEngine engine(testing::kTiny, schedule,
                            partition_uniform(testing::kTiny.pipeline_layers(), schedule.num_stages()), options);
      engine.init_parameters(11);
      const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
      for (int step = 0; step < 3; ++step) {
        EXPECT_EQ(engine.step(step, source).grad_square_small.has_value(), interval == 1);
      }
      weights.emplace_back();
      for (int s = 0; s < engine.num_stages(); ++s) {
        const auto p = engine.stage(StageId(s)).parameters();
        weights.back().insert(weights.back().end(), p.begin(), p.end());
      }
    }
    EXPECT_EQ(weights[0], weights[1]) << name;
  }
}

}  // namespace
}  // namespace pipeflow::runtime
