#include "pipeflow/plan/planner.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "../support/error_of.h"
#include "pipeflow/config/run_config.h"
#include "pipeflow/core/units.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/sim/prediction.h"
#include "pipeflow/sim/run_metadata.h"

namespace pipeflow {
namespace {

using testing::error_of;

PlanRequest small_cluster(const char* model, int devices, int global_batch, int seq_length) {
  PlanRequest request;
  request.model = model_preset(model);
  request.hardware = hardware_preset("a100-80g");
  request.devices = devices;
  request.global_batch = global_batch;
  request.seq_length = seq_length;
  return request;
}

void expect_same_layout(const Layout& a, const Layout& b) {
  EXPECT_EQ(a.tensor_parallel, b.tensor_parallel);
  EXPECT_EQ(a.pipeline_ranks, b.pipeline_ranks);
  EXPECT_EQ(a.data_parallel, b.data_parallel);
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  EXPECT_EQ(a.schedule, b.schedule);
  EXPECT_EQ(a.chunks, b.chunks);
  EXPECT_EQ(a.recompute, b.recompute);
  EXPECT_EQ(a.zero, b.zero);
}

// The time bound skips candidates but never the best: the ranked list equals
// the exhaustive simulation's, layout for layout.
// The third cluster's memory limit leaves only pipelined or tensor-parallel
// layouts, where the bound's fill term matters.
TEST(Planner, TheBoundedSearchFindsTheExhaustiveSearchsBest) {
  PlanRequest tight = small_cluster("gpt3-6.7b", 8, 16, 2048);
  tight.memory_fraction = 0.25;
  for (PlanRequest request :
       {small_cluster("gpt2-124m", 8, 16, 1024), small_cluster("gpt3-1.3b", 8, 32, 2048), tight}) {
    request.top_k = 3;
    const PlanResult bounded = plan_layouts(request);
    const PlanResult exhaustive = plan_layouts_exhaustively(request);
    ASSERT_EQ(bounded.best.size(), 3u);
    ASSERT_EQ(exhaustive.best.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(bounded.best[i].step_time_s, exhaustive.best[i].step_time_s) << request.model.name << " #" << i;
      expect_same_layout(bounded.best[i].layout, exhaustive.best[i].layout);
    }
    EXPECT_EQ(bounded.candidates, exhaustive.candidates);
    EXPECT_GT(bounded.pruned, 0) << request.model.name;
    EXPECT_LT(bounded.simulated, exhaustive.simulated) << request.model.name;
    EXPECT_EQ(exhaustive.pruned, 0);
  }
  const PlanResult pipelined = plan_layouts(tight);
  EXPECT_GT(pipelined.best.front().layout.pipeline_ranks * pipelined.best.front().layout.tensor_parallel, 1);
}

// A measured run of gpt2-124m on 2 × a100-80g (2 stages, 1F1B, 16 micro-batches of 1 × 1024 tokens) whose
// forwards took half the cost model's time and whose backwards (B, I, W) twice.
constexpr double kForwardScale = 0.5;
constexpr double kBackwardScale = 2;

RunMetadata measured_gpt2_run() {
  RunOverrides o;
  o.set("model", "gpt2-124m");
  o.set("hardware", "a100-80g");
  o.set("devices", 2);
  o.set("pipeline.stages", 2);
  o.set("seq_length", 1024);
  o.set("train_batch_size", 16);
  o.set("train_micro_batch_size_per_gpu", 1);
  o.set("bf16.enabled", true);
  const RunConfig config = default_run_config(o);
  const Layout layout = layout_of(resolve(config));
  MeasuredProfile costs =
      profile_of_costs(layout_costs(layout, layout_schedule(layout)).costs, "forward half, backward twice the model's");
  for (ProfiledStage& stage : costs.stages) {
    for (ActionKind kind : {ActionKind::kForward, ActionKind::kBackward, ActionKind::kBackwardInput,
                            ActionKind::kBackwardWeight}) {
      const double scale = kind == ActionKind::kForward ? kForwardScale : kBackwardScale;
      stage.costs.set_duration(kind, stage.costs.duration(kind) * scale);
    }
  }
  return RunMetadata{"planner_test", config, costs, true};
}

// With a measured run the bound prices the calibrated costs: the bounded
// search still finds the exhaustive one's best (measured forwards faster than
// modelled: a bound on the cost model's costs would skip layouts that rank).
TEST(Planner, ACalibratedSearchBoundsWithTheCalibratedCostsAndFindsTheExhaustiveBest) {
  PlanRequest request = small_cluster("gpt2-124m", 8, 16, 1024);
  request.top_k = 3;
  request.measured = measured_gpt2_run();
  const PlanResult bounded = plan_layouts(request);
  const PlanResult exhaustive = plan_layouts_exhaustively(request);
  ASSERT_EQ(bounded.best.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(bounded.best[i].step_time_s, exhaustive.best[i].step_time_s) << i;
    expect_same_layout(bounded.best[i].layout, exhaustive.best[i].layout);
  }
  EXPECT_GT(bounded.pruned, 0);
  // Each is the step analyze's Resimulator (simulate --profile-config) predicts for it.
  const Resimulator resimulator(*request.measured);
  for (const PlanCandidate& c : bounded.best) {
    EXPECT_DOUBLE_EQ(c.step_time_s, resimulator.predict(c.layout).result.step_time_s);
  }
}

// On one device every layout is another cut than the run's 2 stages: its
// costs are the cost model's with the forwards halved and the backwards
// doubled, the step simulated here from costs scaled by hand.
TEST(Planner, AMeasuredRunScalesEveryLayoutsForwardsAndBackwardsByItsMeasuredOverModelled) {
  PlanRequest request = small_cluster("gpt2-124m", 1, 16, 1024);
  request.top_k = 1;
  const PlanResult modelled = plan_layouts(request);
  request.measured = measured_gpt2_run();
  const PlanResult calibrated = plan_layouts(request);
  ASSERT_EQ(calibrated.best.size(), 1u);
  const Layout& best = calibrated.best.front().layout;
  const Schedule schedule = layout_schedule(best);
  LayoutCosts costs = layout_costs(best, schedule);
  for (StageCosts& stage : costs.costs.stages) {
    for (ActionKind kind : {ActionKind::kForward, ActionKind::kBackward, ActionKind::kBackwardInput,
                            ActionKind::kBackwardWeight}) {
      stage.set_duration(kind, stage.duration(kind) * (kind == ActionKind::kForward ? kForwardScale : kBackwardScale));
    }
  }
  const double step = simulate(schedule, costs.costs).step_time_s;
  EXPECT_NEAR(calibrated.best.front().step_time_s, step, 1e-12 * step);
  // One rank runs its m forwards and backwards back to back: the step grows by m · (B − F / 2) of the model's.
  const StageCosts model = layout_costs(best, schedule).costs.stages.at(0);
  const double model_step = simulate(schedule, layout_costs(best, schedule).costs).step_time_s;
  const int m = schedule.num_microbatches();
  EXPECT_NEAR(calibrated.best.front().step_time_s - model_step, m * (model.backward_s - model.forward_s / 2),
              1e-9 * step);
  EXPECT_GE(calibrated.best.front().step_time_s, modelled.best.front().step_time_s);
}

// The calibration holds for the model and hardware measured.
TEST(Planner, AMeasuredRunOfAnotherModelOrHardwareIsRefused) {
  PlanRequest request = small_cluster("gpt2-355m", 1, 16, 1024);
  request.measured = measured_gpt2_run();
  EXPECT_NE(error_of([&] { plan_layouts(request); }).find("the measured run is of gpt2-124m"), std::string::npos);
  request = small_cluster("gpt2-124m", 1, 16, 1024);
  request.hardware = hardware_preset("h100");
  request.measured = measured_gpt2_run();
  EXPECT_NE(error_of([&] { plan_layouts(request); }).find("the measured run ran on a100-80g and the plan is for h100"),
            std::string::npos);
}

// The issue's check, without the planner's machinery: every layout of the
// search space (planner.h) built here and predicted on its own (predict:
// its schedule made, its costs priced, one step simulated), kept when every
// rank's peak is within the limit, a layout that a second partition method
// cuts as the first did counted once. The planner's ranked list has the
// same step times, best first, and its best is a layout of that fastest
// time. Both partition methods (the default), so that each layout is also
// tried cut both ways. At one stage a schedule that holds as much as an
// earlier one is counted once too.
TEST(Planner, TheBestIsTheBestOfEveryLayoutPredictedOnItsOwn) {
  PlanRequest tight = small_cluster("gpt3-1.3b", 8, 16, 2048);
  tight.memory_fraction = 0.2;
  for (PlanRequest request : {small_cluster("gpt2-124m", 8, 16, 1024), tight}) {
    request.top_k = 4;
    request.partitions = {parse_partition_method("parameters"), parse_partition_method("balanced")};
    const double limit = request.memory_fraction * request.hardware.memory_bytes;
    std::vector<std::pair<double, Layout>> fitting;
    std::set<std::tuple<int, int, int, std::string, int, Recompute, ZeroStage, std::vector<int>>> cuts;
    std::set<std::tuple<int, int, Recompute, ZeroStage, double>> one_stage;
    for (int tp = 1; tp <= request.hardware.devices_per_node; tp *= 2) {
      for (int pp = 1; tp * pp <= request.devices; pp *= 2) {
        const int dp = request.devices / (tp * pp);
        for (int b = 1; b * dp <= request.global_batch; b *= 2) {
          for (const ScheduleInfo& info : list_schedules()) {
            if (info.inference) continue;
            const int most = info.placement == Placement::kV ? 2 : info.takes_virtual && pp > 1 ? request.max_virtual : 1;
            for (int v = info.placement == Placement::kV || most > 1 ? 2 : 1; v <= most; ++v) {
              for (Recompute recompute : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
                for (ZeroStage zero : {ZeroStage::kNone, ZeroStage::kOne}) {
                  for (const PartitionMethod& partition : request.partitions) {
                    if (zero == ZeroStage::kOne && dp == 1) continue;
                    const Layout l{.model = request.model, .hardware = request.hardware, .devices = request.devices,
                                   .tensor_parallel = tp, .pipeline_ranks = pp, .data_parallel = dp,
                                   .micro_batch = b, .global_batch = request.global_batch,
                                   .seq_length = request.seq_length, .schedule = info.name, .chunks = v, .file_schedule = {},
                                   .recompute = recompute, .sequence_parallel = tp > 1, .partition = partition,
                                   .zero = zero, .comm_mode = CommMode::kOverlapped,
                                   .precision = request.precision, .gradient_precision = request.precision,
                                   .gradient_accumulation = default_gradient_accumulation(request.precision, zero)};
                    try {
                      const Prediction p = predict(l);
                      // A second method's identical cut is the same layout: listed once.
                      const auto cut = std::tuple(tp, pp, b, info.name, v, recompute, zero, p.costs.partition.boundaries);
                      if (!cuts.insert(cut).second) continue;
                      double largest = 0;
                      for (const RankResult& r : p.result.ranks) largest = std::max(largest, r.peak_memory_bytes);
                      // One stage: a schedule that holds as much as an earlier one is the same layout.
                      if (pp * v == 1 && !one_stage.insert({tp, b, recompute, zero, largest}).second) continue;
                      if (largest <= limit) fitting.emplace_back(p.result.step_time_s, l);
                    } catch (const Error&) {
                      // a schedule's constraint, a batch or heads that do not divide, too few layers
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
    ASSERT_GE(fitting.size(), 4u) << request.model.name;
    std::sort(fitting.begin(), fitting.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const PlanResult plan = plan_layouts(request);
    ASSERT_EQ(plan.best.size(), 4u);
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(plan.best[i].step_time_s, fitting[i].first) << request.model.name << " #" << i;
    }
    EXPECT_EQ(predict(plan.best.front().layout).result.step_time_s, fitting.front().first);
    EXPECT_GT(plan.rejected[static_cast<int>(RejectReason::kSameCut)], 0) << request.model.name;
    EXPECT_GT(plan.pruned, 0) << request.model.name;
  }
}

// Every layout returned fits by the simulator's own account, and its figures
// are simulate's.
TEST(Planner, EveryLayoutReturnedFitsAsTheSimulatorSays) {
  PlanRequest request = small_cluster("gpt3-6.7b", 8, 16, 2048);
  request.top_k = 5;
  request.memory_fraction = 0.5;
  const PlanResult result = plan_layouts(request);
  ASSERT_FALSE(result.best.empty());
  EXPECT_GT(result.rejected[static_cast<int>(RejectReason::kOutOfMemory)], 0);
  for (const PlanCandidate& c : result.best) {
    const Prediction p = predict(c.layout);
    EXPECT_DOUBLE_EQ(p.result.step_time_s, c.step_time_s);
    EXPECT_DOUBLE_EQ(p.tokens_per_s, c.tokens_per_s);
    EXPECT_DOUBLE_EQ(p.mfu, c.mfu);
    ASSERT_EQ(p.result.ranks.size(), c.stage_peak_bytes.size());
    for (std::size_t r = 0; r < p.result.ranks.size(); ++r) {
      EXPECT_LE(p.result.ranks[r].peak_memory_bytes, 0.5 * request.hardware.memory_bytes);
      EXPECT_DOUBLE_EQ(p.result.ranks[r].peak_memory_bytes, c.stage_peak_bytes[r]);
    }
  }
  for (std::size_t i = 1; i < result.best.size(); ++i) {
    EXPECT_LE(result.best[i - 1].step_time_s, result.best[i].step_time_s);
  }
}

// 4 devices, B = 6: d = 4 leaves 1.5 sequences a replica, b = 4 divides no
// replica's share: every candidate is accounted for, once.
TEST(Planner, CountsEveryCandidateAndItsRejections) {
  const PlanRequest request = small_cluster("gpt2-124m", 4, 6, 512);
  for (const PlanResult& result : {plan_layouts(request), plan_layouts_exhaustively(request)}) {
    std::int64_t rejected = 0;
    for (std::int64_t count : result.rejected) rejected += count;
    EXPECT_EQ(rejected + result.simulated + result.pruned, result.candidates);
    EXPECT_GT(result.rejected[static_cast<int>(RejectReason::kIndivisibleBatch)], 0);
    EXPECT_GT(result.rejected[static_cast<int>(RejectReason::kSchedule)], 0);
  }
}

TEST(Planner, NothingFitsIsAnErrorWithTheCounts) {
  PlanRequest request = small_cluster("gpt3-175b", 8, 8, 2048);
  const std::string error = error_of([&] { plan_layouts(request); });
  EXPECT_NE(error.find("no layout of gpt3-175b on 8 × a100-80g fits"), std::string::npos) << error;
  EXPECT_NE(error.find("out of memory"), std::string::npos) << error;
  request.memory_fraction = 1.5;
  EXPECT_EQ(error_of([&] { plan_layouts(request); }),
            "memory fraction = 1.5: must be in (0, 1] (the share of device memory a stage may fill; the course uses "
            "0.8)");
}

// GPT-3 175B with its first 48 blocks frozen (48 · (12h² + 13h) = 48 · 1,812,086,784 = 86,980,165,632 of its
// 174,604,259,328 parameters): the model states the error names are the trainable parameters' gradients and
// optimizer state beside every weight, and it says so.
TEST(Planner, NothingFitsNamesWhoseGradientsAndOptimizerStateTheModelStatesAre) {
  PlanRequest request = small_cluster("gpt3-175b", 8, 8, 2048);
  for (int i = 0; i < 48; ++i) request.training.freeze.push_back("block." + std::to_string(i));
  const std::string error = error_of([&] { plan_layouts(request); });
  EXPECT_NE(error.find("(weights, gradients and optimizer state, before activations; gradients and optimizer state "
                       "are those of the 87.62B trainable parameters (the 86.98B frozen have no gradients or "
                       "optimizer state)) > the limit"),
            std::string::npos)
      << error;
}

// Llama 3 405B at 128K context: 756 GiB of bf16 weights and a 63 GiB cache
// cannot sit on one 80 GB device; cut into enough stages they do.
// The largest device counts neither overflow (the divisors of INT_MAX, p·v
// and b·d) nor crash: no layout of them fits, and the counts say why.
TEST(Planner, TheLargestDeviceCountsAreCountedNotOverflowed) {
  for (const int devices : {2147483647, 2147483646}) {
    PlanRequest request = small_cluster("gpt2-124m", devices, 1 << 20, 1024);
    const std::string error = error_of([&] { plan_layouts(request); });
    EXPECT_NE(error.find("no layout of gpt2-124m on " + std::to_string(devices) + " × a100-80g fits"),
              std::string::npos)
        << error;
  }
  const PlanResult million = plan_layouts(small_cluster("gpt2-124m", 1 << 20, 1 << 20, 1024));
  ASSERT_FALSE(million.best.empty());
  const Layout& best = million.best.front().layout;
  EXPECT_EQ(static_cast<std::int64_t>(best.tensor_parallel) * best.pipeline_ranks * best.data_parallel, 1 << 20);
}

TEST(InferencePlan, Llama405BAt128KFitsOnlyOnSeveralStages) {
  InferencePlanRequest request;
  request.setup.model = model_preset("llama3-405b");
  request.setup.hardware = hardware_preset("h100");
  request.setup.context = 131072;
  request.max_stages = 16;
  const InferencePlan plan = plan_inference(request);
  EXPECT_EQ(plan.limit_bytes, 0.8 * 80 * kGiB);
  ASSERT_FALSE(plan.rejected.empty());
  ASSERT_FALSE(plan.fitting.empty());
  EXPECT_EQ(plan.rejected.front().stages, 1);
  EXPECT_EQ(plan.rejected.front().rejected.rfind("out of memory: stage 0 needs ", 0), 0u) << plan.rejected.front().rejected;
  int fewest = request.max_stages;
  for (const InferenceOption& o : plan.fitting) {
    EXPECT_LE(o.prediction.peak_bytes(), plan.limit_bytes);
    fewest = std::min(fewest, o.stages);
  }
  for (const InferenceOption& o : plan.rejected) {
    EXPECT_LT(o.stages, fewest);  // more stages never need more memory per stage
    ASSERT_FALSE(o.prediction.stages.empty());
    EXPECT_GT(o.prediction.peak_bytes(), plan.limit_bytes);
  }
  EXPECT_EQ(fewest, 15);  // 14 stages: the last holds 64.3 GiB
  EXPECT_EQ(plan.rejected.size() + plan.fitting.size(), 16u);
  for (std::size_t i = 1; i < plan.fitting.size(); ++i) {
    EXPECT_GE(plan.fitting[i - 1].prediction.tokens_per_s, plan.fitting[i].prediction.tokens_per_s);
  }
  // Too many stages for the layers is a reason, not an error.
  request.setup.model = model_preset("llama3-8b");
  request.setup.context = 8192;
  request.max_stages = 35;
  const InferencePlan small = plan_inference(request);
  EXPECT_TRUE(small.rejected.empty());
  EXPECT_EQ(small.untried,
            "35 .. 35 stages: more than the 34 pipeline layers of llama3-8b (embedding, 32 blocks, head), and every "
            "stage needs one");
  EXPECT_EQ(error_of([&] {
              request.memory_fraction = 1.5;
              plan_inference(request);
            }),
            "memory fraction = 1.5: must be in (0, 1] (the share of device memory a stage may fill; the course uses "
            "0.8)");
}

// --devices 1000000 used to predict every stage count up to a million (15 s)
// and list them all (146 MB): the stage counts past the pipeline layers are
// one reason, and the top_k that fit are listed with the count of the rest.
TEST(InferencePlan, StageCountsAreBoundedByTheLayersAndTheListingByTopK) {
  InferencePlanRequest request;
  request.setup.model = model_preset("llama3-70b");
  request.setup.hardware = hardware_preset("a100-80g");
  request.max_stages = 1'000'000;
  const InferencePlan plan = plan_inference(request);
  ASSERT_EQ(plan.fitting.size(), 5u);
  EXPECT_EQ(plan.more_fitting + 5 + static_cast<int>(plan.rejected.size()), 82);  // every P of 1 .. 82 once
  for (const InferenceOption& o : plan.rejected) EXPECT_LE(o.stages, 82);
  EXPECT_EQ(plan.untried,
            "83 .. 1000000 stages: more than the 82 pipeline layers of llama3-70b (embedding, 80 blocks, head), and "
            "every stage needs one");
  request.top_k = 100;
  const InferencePlan all = plan_inference(request);
  EXPECT_EQ(all.more_fitting, 0);
  EXPECT_EQ(static_cast<int>(all.fitting.size()), plan.more_fitting + 5);
  for (std::size_t i = 0; i < plan.fitting.size(); ++i) EXPECT_EQ(plan.fitting[i].stages, all.fitting[i].stages);
  request.top_k = 0;
  EXPECT_EQ(error_of([&] { plan_inference(request); }), "top = 0: must be >= 1 (the stage counts to list)");
}

// At one stage every schedule runs the same forwards and backwards one after
// another: a schedule that holds as much as an earlier one is that layout
// again, listed once (GPipe and looped BFS hold every micro-batch, 1F1B,
// interleaved, ZB-H1 and ZB-H2 one); 5 identical rows used to be listed.
TEST(Planner, OneStageListsEachScheduleThatHoldsAsMuchOnce) {
  PlanRequest request = small_cluster("gpt2-124m", 1, 8, 1024);
  request.top_k = 50;
  const PlanResult plan = plan_layouts(request);
  std::set<std::tuple<int, Recompute, std::vector<double>>> seen;
  std::map<int, std::set<std::string>> schedules;  // one-chunk schedules listed, by micro-batch size
  for (const PlanCandidate& c : plan.best) {
    const Layout& l = c.layout;
    ASSERT_EQ(l.pipeline_ranks, 1);
    if (l.chunks != 1) continue;  // ZB-V and DualPipeV: two stages on the rank
    EXPECT_TRUE(seen.insert({l.micro_batch, l.recompute, c.stage_peak_bytes}).second)
        << l.schedule << " at b " << l.micro_batch << " repeats an earlier schedule's row";
    if (l.recompute == Recompute::kNone) schedules[l.micro_batch].insert(l.schedule);
  }
  EXPECT_EQ(schedules[8], (std::set<std::string>{"gpipe"}));  // m = 1: every schedule is F then B
  EXPECT_EQ(schedules[4], (std::set<std::string>{"gpipe", "1f1b"}));
  EXPECT_GT(plan.rejected[static_cast<int>(RejectReason::kSameSchedule)], 0);
  std::int64_t accounted = plan.simulated + plan.pruned;
  for (std::int64_t n : plan.rejected) accounted += n;
  EXPECT_EQ(accounted, plan.candidates);
  // The one listed is the step every schedule of that layout is simulated to take.
  for (const PlanCandidate& c : plan.best) {
    if (c.layout.chunks != 1) continue;
    for (const char* other : {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2"}) {
      Layout l = c.layout;
      l.schedule = other;
      EXPECT_NEAR(predict(l).result.step_time_s, c.step_time_s, 1e-12 * c.step_time_s) << other;
    }
  }
}

}  // namespace
}  // namespace pipeflow
