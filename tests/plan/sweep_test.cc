#include "pipeflow/plan/sweep.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "../support/error_of.h"
#include "../trace/xml_check.h"
#include "pipeflow/core/config.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/prediction.h"

namespace pipeflow {
namespace {

using testing::error_of;

const ConfigSource kConfig = [](const RunOverrides& overrides) {
  return parse_run_config(Config::parse(R"({"model": "gpt2-124m", "hardware": "a100-80g", "seq_length": 1024,
      "train_batch_size": 32, "train_micro_batch_size_per_gpu": 2,
      "pipeline": {"stages": 4, "schedule": "1f1b", "partition_method": "balanced"}})",
                                        "run.json"),
                          overrides);
};

TEST(Sweep, EachPointIsTheSimulationOfItsSettingAndMicrobatchesKeepTheGlobalBatch) {
  const Sweep sweep = run_sweep(kConfig, {}, {parse_sweep_axis("microbatches=4,8,16")});
  ASSERT_EQ(sweep.points.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const int m = 4 << i;
    RunOverrides o;
    o.micro_batch = 32 / m;
    const Prediction p = predict(layout_of(resolve(kConfig(o))));
    ASSERT_EQ(p.microbatches, m);
    const SweepPoint& point = sweep.points[i];
    EXPECT_EQ(point.error, "");
    EXPECT_DOUBLE_EQ(point.step_time_s, p.result.step_time_s);
    EXPECT_DOUBLE_EQ(point.bubble_ratio, p.result.bubble_ratio);
    EXPECT_DOUBLE_EQ(point.tokens_per_s, p.tokens_per_s);
  }
  EXPECT_GT(sweep.points[0].bubble_ratio, sweep.points[2].bubble_ratio);  // more micro-batches, less bubble
}

TEST(Sweep, APointThatCannotRunSaysWhyAndTheOthersStillRun) {
  const Sweep sweep = run_sweep(kConfig, {}, {parse_sweep_axis("schedule=1f1b,zbv"), parse_sweep_axis("microbatches=2,8")});
  ASSERT_EQ(sweep.points.size(), 4u);
  EXPECT_EQ(sweep.points[0].setting, (std::vector<std::string>{"1f1b", "2"}));
  EXPECT_NE(sweep.points[0].error.find("1f1b needs microbatches >= stages"), std::string::npos) << sweep.points[0].error;
  EXPECT_EQ(sweep.points[1].error, "");
  EXPECT_NE(sweep.points[2].error, "");  // zbv at v = 1 is refused
}

TEST(Sweep, ThePlotsAreWellFormedAndHoldTheNumbersOfTheJson) {
  const Sweep sweep =
      run_sweep(kConfig, {}, {parse_sweep_axis("microbatches=4,8,16"), parse_sweep_axis("recompute=none,full")});
  const std::string svg = sweep_svg(sweep);
  EXPECT_EQ(testing::XmlCheck(svg).run(), "");
  const nlohmann::json json = nlohmann::json::parse(sweep_json(sweep));
  ASSERT_EQ(json["points"].size(), 6u);
  for (const char* metric : {"step_time_s", "bubble_ratio", "peak_memory_bytes", "tokens_per_s"}) {
    const std::size_t plot = svg.find(std::string("data-metric=\"") + metric + "\"");
    ASSERT_NE(plot, std::string::npos) << metric;
    // Each point's value is somewhere in this plot, exactly as the JSON has it.
    const std::size_t end = svg.find("</g>", plot);
    for (const auto& point : json["points"]) {
      const std::string setting = point["microbatches"].get<std::string>() + "," + point["recompute"].get<std::string>();
      const std::size_t circle = svg.find("data-setting=\"" + setting + "\"", plot);
      ASSERT_LT(circle, end) << metric << " " << setting;
      const std::size_t value = svg.find("data-value=\"", circle) + 12;
      EXPECT_EQ(std::stod(svg.substr(value, svg.find('"', value) - value)), point[metric].get<double>())
          << metric << " " << setting;
    }
  }
}

TEST(Sweep, AScheduleMayNameItsVirtualStages) {
  const Sweep sweep = run_sweep(kConfig, {}, {parse_sweep_axis("schedule=1f1b,interleaved-1f1b:2")});
  ASSERT_EQ(sweep.points.size(), 2u);
  EXPECT_EQ(sweep.points[1].error, "");
  RunOverrides o;
  o.schedule = "interleaved-1f1b";
  o.virtual_stages = 2;
  EXPECT_DOUBLE_EQ(sweep.points[1].step_time_s, predict(layout_of(resolve(kConfig(o)))).result.step_time_s);
}

TEST(Sweep, RejectsAnUnknownKeyAndABadValue) {
  EXPECT_EQ(error_of([] { parse_sweep_axis("speed=1,2"); }),
            "--vary speed=1,2: give KEY=V1,V2,... with KEY one of microbatches, micro-batch, global-batch, stages, "
            "schedule, virtual, recompute, partition, comm, tensor-parallel, data-parallel, seq-length");
  EXPECT_EQ(error_of([] { parse_sweep_axis("stages=2,,4"); }),
            "--vary stages=2,,4: an empty value; separate values by single commas");
  const Sweep sweep = run_sweep(kConfig, {}, {parse_sweep_axis("microbatches=3")});
  EXPECT_EQ(sweep.points[0].error,
            "--vary microbatches=3: the global batch 32 is not a whole number of 3 micro-batches on each of 1 replicas");
}

}  // namespace
}  // namespace pipeflow
