// The rank group in threads: its collectives over every sub-group, its
// failure policy, and data parallelism in one process equal to the
// unpipelined run.

#include "pipeflow/runtime/rank_group.h"

#include <gtest/gtest.h>

#include <cmath>

#include <filesystem>
#include <thread>
#include <numeric>
#include <stdexcept>

#include "pipeflow/nn/adamw.h"
#include "pipeflow/runtime/batch_source.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "pipeflow/schedule/generators.h"
#include "../support/error_of.h"
#include "../support/temp_dir.h"
#include "test_support.h"

namespace pipeflow::runtime {
namespace {

using testing::Reference;
using testing::error_of;

constexpr auto kTimeout = std::chrono::seconds(20);

// pipeline 2 x data parallel 3: world ranks 0..5, rank w = 3·p + d.
const RankLayout kLayout{.pipeline = 2, .data_parallel = 3};

TEST(RankGroup, InThreadsEveryRankIsLocalAndTheSubGroupsFollowMegatronsOrder) {
  const auto group = RankGroup::in_threads(kLayout);
  EXPECT_EQ(group->local_ranks(), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(group->is_reporter());
  EXPECT_FALSE(group->spans_processes());
  EXPECT_TRUE(group->shares_process(0, 5));
  for (int w = 0; w < kLayout.world_size(); ++w) {
    EXPECT_EQ(group->world(w).size(), 6);
    EXPECT_EQ(group->world(w).rank(), w);
    EXPECT_EQ(group->pipeline(w).size(), 2);
    EXPECT_EQ(group->pipeline(w).rank(), w / 3) << w;
    EXPECT_EQ(group->data(w).size(), 3);
    EXPECT_EQ(group->data(w).rank(), w % 3) << w;
  }
}

TEST(RankGroup, InThreadsAllGatherAndGatherBytesGoMemberByMember) {
  const auto group = RankGroup::in_threads(kLayout);
  std::vector<std::vector<double>> gathered(6);
  std::vector<std::vector<std::string>> bytes(6);
  std::vector<std::string> broadcast(6);
  group->run(
      [&](int w) {
        const std::array<double, 2> mine{static_cast<double>(w), 10.0 * w};
        gathered[static_cast<std::size_t>(w)] = group->data(w).all_gather(mine, deadline_after(kTimeout), "test");
        bytes[static_cast<std::size_t>(w)] =
            group->pipeline(w).gather_bytes(std::string(static_cast<std::size_t>(w), 'x'), deadline_after(kTimeout),
                                            "test");
        broadcast[static_cast<std::size_t>(w)] = "from " + std::to_string(w);
        group->world(w).broadcast_bytes(broadcast[static_cast<std::size_t>(w)], deadline_after(kTimeout), "test");
        group->world(w).barrier(deadline_after(kTimeout), "test");
      },
      [] {});
  // Pipeline rank 1's data-parallel group is world ranks 3, 4, 5.
  EXPECT_EQ(gathered[4], (std::vector<double>{3, 30, 4, 40, 5, 50}));
  EXPECT_EQ(gathered[0], (std::vector<double>{0, 0, 1, 10, 2, 20}));
  // The pipeline of data rank 2 is world ranks 2 and 5; its member 0 (world rank 2) gets both.
  EXPECT_EQ(bytes[2], (std::vector<std::string>{"xx", "xxxxx"}));
  EXPECT_TRUE(bytes[5].empty());
  for (const std::string& b : broadcast) EXPECT_EQ(b, "from 0");
}

TEST(RankGroup, InThreadsReduceScatterSumsEachPartInMemberOrderAndTheGathersFillTheRest) {
  const auto group = RankGroup::in_threads(kLayout);
  constexpr std::size_t kCount = 11;  // 4 + 4 + 3: unequal parts
  std::vector<std::vector<float>> summed(6, std::vector<float>(kCount));
  std::vector<std::vector<float>> all_reduced(6, std::vector<float>(kCount));
  std::vector<std::vector<float>> gathered(6, std::vector<float>(kCount, -1));
  const auto value = [](int w, std::size_t i) { return 0.1f * static_cast<float>(w + 1) + static_cast<float>(i); };
  group->run(
      [&](int w) {
        auto& mine = summed[static_cast<std::size_t>(w)];
        for (std::size_t i = 0; i < kCount; ++i) mine[i] = value(w, i);
        group->data(w).reduce_scatter_parts(mine, "test", 3)->finish(deadline_after(kTimeout));
        auto& everything = all_reduced[static_cast<std::size_t>(w)];
        for (std::size_t i = 0; i < kCount; ++i) everything[i] = value(w, i);
        group->data(w).all_reduce_sum(everything, deadline_after(kTimeout), "test", 3);
        auto& parts = gathered[static_cast<std::size_t>(w)];
        const nn::OptimizerShard own = nn::OptimizerShard::of(kCount, 3, w % 3);
        for (auto i = own.begin; i < own.end; ++i) parts[static_cast<std::size_t>(i)] = static_cast<float>(w);
        group->data(w).gather_parts(parts, deadline_after(kTimeout), "test");
      },
      [] {});
  for (int w = 0; w < 6; ++w) {
    const int first = w - w % 3;  // the group's world ranks: first, first + 1, first + 2
    const nn::OptimizerShard own = nn::OptimizerShard::of(kCount, 3, w % 3);
    for (std::size_t i = 0; i < kCount; ++i) {
      const float sum = value(first, i) + value(first + 1, i) + value(first + 2, i);
      if (static_cast<std::int64_t>(i) >= own.begin && static_cast<std::int64_t>(i) < own.end) {
        EXPECT_EQ(summed[static_cast<std::size_t>(w)][i], sum) << "rank " << w << " element " << i;
      }
      EXPECT_EQ(all_reduced[static_cast<std::size_t>(w)][i], sum) << "rank " << w << " element " << i;
    }
    // Member 0 holds every member's part; the others keep their own alone.
    for (int k = 0; k < 3; ++k) {
      const nn::OptimizerShard part = nn::OptimizerShard::of(kCount, 3, k);
      for (auto i = part.begin; i < part.end; ++i) {
        const float got = gathered[static_cast<std::size_t>(w)][static_cast<std::size_t>(i)];
        if (w % 3 == 0 || k == w % 3) {
          EXPECT_EQ(got, static_cast<float>(first + k)) << "rank " << w << " element " << i;
        } else {
          EXPECT_EQ(got, -1.0f);
        }
      }
    }
  }
}

TEST(RankGroup, InThreadsAFailingRankEndsTheOthersWaitsAndItsErrorIsRethrown) {
  const auto group = RankGroup::in_threads(kLayout);
  bool aborted = false;
  const std::string error = error_of([&] {
    group->run(
        [&](int w) {
          if (w == 4) throw Error("rank 4 failed on purpose");
          group->world(w).barrier(deadline_after(kTimeout), "a barrier rank 4 never reaches");
        },
        [&] { aborted = true; });
  });
  EXPECT_EQ(error, "rank 4 failed on purpose");
  EXPECT_TRUE(aborted);
  // The group serves the next run as new.
  std::vector<double> sums(6);
  group->run(
      [&](int w) {
        const double one = 1;
        const std::vector<double> all = group->world(w).all_gather({&one, 1}, deadline_after(kTimeout), "test");
        sums[static_cast<std::size_t>(w)] = std::accumulate(all.begin(), all.end(), 0.0);
      },
      [] {});
  EXPECT_EQ(sums, std::vector<double>(6, 6.0));
}

TEST(RankGroup, InThreadsAWaitPastItsDeadlineNamesWhatItWaitedForAndWhoNeverCame) {
  const auto group = RankGroup::in_threads({.pipeline = 1, .data_parallel = 3});
  const std::string error = error_of([&] {
    group->run(
        [&](int w) {
          if (w == 2) {
            // Stays away until the others' deadline has passed, then comes to no meeting.
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            return;
          }
          group->data(w).barrier(deadline_after(std::chrono::milliseconds(100)), "the test's barrier");
        },
        [] {});
  });
  EXPECT_NE(error.find("waiting for the test's barrier in the data-parallel group of pipeline rank 0"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("world rank 2 never came"), std::string::npos) << error;
}

// Megatron-LM's two orders over t = 2, d = 2, p = 2: tp-dp-pp (default)
// w = (p·2 + d)·2 + t, tp-pp-dp w = (d·2 + p)·2 + t; each world rank's
// coordinates invert its number, and the groups follow.
TEST(RankGroup, BothRankOrdersNumberTheWorldAsMegatronDoes) {
  const RankLayout tdp{.pipeline = 2, .data_parallel = 2, .tensor = 2};
  const RankLayout tpd{.pipeline = 2, .data_parallel = 2, .tensor = 2, .order = RankOrder::kTensorPipelineData};
  EXPECT_EQ(tdp.world_rank(1, 0, 0), 4);
  EXPECT_EQ(tdp.world_rank(0, 1, 1), 3);
  EXPECT_EQ(tpd.world_rank(1, 0, 0), 2);
  EXPECT_EQ(tpd.world_rank(0, 1, 1), 5);
  for (const RankLayout& l : {tdp, tpd}) {
    for (int w = 0; w < l.world_size(); ++w) {
      EXPECT_EQ(l.world_rank(l.pipeline_rank(w), l.data_rank(w), l.tensor_rank(w)), w) << w;
    }
  }
  EXPECT_EQ(tpd.describe(),
            "pipeline (data-parallel rank 0, tensor-parallel rank 0): world ranks 0 2\n"
            "pipeline (data-parallel rank 0, tensor-parallel rank 1): world ranks 1 3\n"
            "pipeline (data-parallel rank 1, tensor-parallel rank 0): world ranks 4 6\n"
            "pipeline (data-parallel rank 1, tensor-parallel rank 1): world ranks 5 7\n"
            "data-parallel group (pipeline rank 0, tensor-parallel rank 0): world ranks 0 4\n"
            "data-parallel group (pipeline rank 0, tensor-parallel rank 1): world ranks 1 5\n"
            "data-parallel group (pipeline rank 1, tensor-parallel rank 0): world ranks 2 6\n"
            "data-parallel group (pipeline rank 1, tensor-parallel rank 1): world ranks 3 7\n"
            "tensor-parallel group (pipeline rank 0, data-parallel rank 0): world ranks 0 1\n"
            "tensor-parallel group (pipeline rank 0, data-parallel rank 1): world ranks 4 5\n"
            "tensor-parallel group (pipeline rank 1, data-parallel rank 0): world ranks 2 3\n"
            "tensor-parallel group (pipeline rank 1, data-parallel rank 1): world ranks 6 7\n");
  const auto group = RankGroup::in_threads(tpd);
  EXPECT_EQ(group->data(4).rank(), 1);
  EXPECT_EQ(group->pipeline(6).rank(), 1);
  EXPECT_EQ(group->tensor(7).rank(), 1);
}

TEST(RankGroup, ALayoutOfNoRanksIsRefused) {
  EXPECT_EQ(error_of([] { RankGroup::in_threads({.pipeline = 0, .data_parallel = 1}); }),
            "a rank group of pipeline 0 x data parallel 1 x tensor parallel 1: each must be at least 1");
}

// Data parallelism in threads: d replicas of a 2-rank pipeline, each m
// micro-batches, equal the unpipelined run on the global batch of m·d.
void expect_data_parallel_equals_unpipelined(const std::string& schedule_name, int data_parallel, bool zero1) {
  const int kMicrobatches = schedule_name == "zbv" ? 4 : 2;  // ZB-V: m >= 2p
  const Schedule schedule = make_schedule(schedule_name, 2, kMicrobatches, schedule_name == "zbv" ? 2 : 1);
  EngineOptions options = testing::tiny_options();
  options.data_parallel = data_parallel;
  options.shard_optimizer = zero1;
  PipelineEngine engine(testing::kTiny, schedule,
                        partition_uniform(testing::kTiny.pipeline_layers(), schedule.num_stages()), options);
  engine.init_parameters(11);
  const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
  Reference unpipelined(kMicrobatches * data_parallel * testing::kMicroBatch);
  const std::string what = schedule_name + " dp " + std::to_string(data_parallel) + (zero1 ? " ZeRO-1" : "");
  // The averaged gradient itself, 1/(m·d) of the sum over every replica's
  // micro-batches: clipping and AdamW would hide a uniform scale in the weights.
  const StepResult first = engine.step(0, source, StepMode::kGradientsOnly);
  EXPECT_NEAR(first.loss, unpipelined.step(0, false), 1e-5 * first.loss) << what;
  EXPECT_NEAR(first.grad_norm, std::sqrt(unpipelined.model().gradient_square_sum()), 1e-5 * first.grad_norm) << what;
  if (!zero1) {  // ZeRO-1: each replica holds the reduced gradient of its own shard only
    const auto with_gradients = engine.assemble_model(true);
    ASSERT_NE(with_gradients, nullptr);
    EXPECT_LT(testing::relative_error(with_gradients->gradients(), unpipelined.model().gradients()), 1e-5) << what;
  }
  for (int step = 0; step < 3; ++step) {
    const StepResult result = engine.step(step, source);
    const double reference = unpipelined.step(step, true);
    EXPECT_NEAR(result.loss, reference, 1e-5 * reference) << what << ", step " << step;
    EXPECT_EQ(result.microbatch_losses.size(), static_cast<std::size_t>(kMicrobatches * data_parallel)) << what;
    EXPECT_EQ(result.ranks.size(), 2U) << what;  // replica 0's pipeline
  }
  const auto model = engine.assemble_model();
  ASSERT_NE(model, nullptr);
  EXPECT_LT(testing::relative_error(model->parameters(), unpipelined.model().parameters()), 1e-5) << what;
}

TEST(DataParallelInThreads, OneFOneBWithTwoAndThreeReplicasEqualsUnpipelined) {
  expect_data_parallel_equals_unpipelined("1f1b", 2, false);
  expect_data_parallel_equals_unpipelined("1f1b", 3, false);
}

TEST(DataParallelInThreads, ZeroOneAndZbvEqualUnpipelined) {
  expect_data_parallel_equals_unpipelined("1f1b", 3, true);
  expect_data_parallel_equals_unpipelined("zbv", 2, true);
}

TEST(DataParallelInThreads, ZeroOneOnAndOffGiveTheSameBits) {
  const Schedule schedule = make_schedule("1f1b", 2, 2, 1);
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<float>> weights;
  for (const bool zero1 : {false, true}) {
    EngineOptions options = testing::tiny_options();
    options.data_parallel = 2;
    options.shard_optimizer = zero1;
    PipelineEngine engine(testing::kTiny, schedule, partition_uniform(testing::kTiny.pipeline_layers(), 2), options);
    engine.init_parameters(11);
    const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
    losses.emplace_back();
    for (int step = 0; step < 3; ++step) losses.back().push_back(engine.step(step, source).loss);
    const auto model = engine.assemble_model();
    weights.emplace_back(model->parameters().begin(), model->parameters().end());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(weights[0], weights[1]);
}

TEST(DataParallelInThreads, ACheckpointOfShardedMomentsResumesWithOneReplica) {
  const std::filesystem::path dir = pipeflow::testing::make_temp_dir();
  const Schedule schedule = make_schedule("1f1b", 2, 2, 1);
  const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
  EngineOptions options = testing::tiny_options();
  options.data_parallel = 2;
  options.shard_optimizer = true;
  PipelineEngine sharded(testing::kTiny, schedule, partition_uniform(testing::kTiny.pipeline_layers(), 2), options);
  sharded.init_parameters(11);
  for (int step = 0; step < 2; ++step) sharded.step(step, source);
  sharded.write_checkpoint(dir / "checkpoint.safetensors", 2);
  ASSERT_TRUE(std::filesystem::is_regular_file(dir / "checkpoint.safetensors"));  // one process: one file
  const nn::SafetensorsFile file = read_checkpoint(dir / "checkpoint.safetensors");
  EXPECT_EQ(file.metadata_count("steps_done"), 2);
  // The whole moments, not one replica's part.
  EXPECT_EQ(file.entry("exp_avg.wte.weight").shape, file.entry("wte.weight").shape);
  // Resumed as one replica of a one-rank pipeline, the weights are those written.
  PipelineEngine whole(testing::kTiny, make_schedule("1f1b", 1, 2, 1), partition_uniform(testing::kTiny.pipeline_layers(), 1),
                       testing::tiny_options());
  EXPECT_EQ(whole.load_checkpoint(file), 2);
  const auto written = sharded.assemble_model();
  const auto loaded = whole.assemble_model();
  EXPECT_EQ(std::vector<float>(written->parameters().begin(), written->parameters().end()),
            std::vector<float>(loaded->parameters().begin(), loaded->parameters().end()));
}

}  // namespace
}  // namespace pipeflow::runtime
