#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include <sys/resource.h>

#include <fmt/format.h>

#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/grid.h"
#include "pipeflow/schedule/io.h"
#include "pipeflow/schedule/passes.h"
#include "test_support.h"

namespace pipeflow::runtime {
namespace {

using namespace std::chrono_literals;
using testing::error_of;
using testing::kTiny;

int thread_count() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++count;
  return count;
}

const DatasetSource& train_source() {
  static const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
  return source;
}

// Blocks every stage's buffer pool has taken from the system so far.
std::int64_t pool_blocks(PipelineEngine& engine) {
  std::int64_t total = 0;
  for (int s = 0; s < engine.num_stages(); ++s) total += engine.stage(StageId(s)).buffer_pool().system_allocations();
  return total;
}

TEST(PipelineEngine, RerunsWithTheSameSeedAreBitIdenticalThreadedOrSerial) {
  const Schedule schedule = make_schedule("1f1b", 4, 8);
  auto a = testing::tiny_engine(schedule);
  auto b = testing::tiny_engine(schedule);
  auto serial = testing::tiny_engine(schedule);
  for (int step = 0; step < 3; ++step) {
    const StepResult ra = a->step(step, train_source());
    const StepResult rb = b->step(step, train_source());
    const StepResult rs = serial->step(step, train_source(), StepMode::kTrain, RunMode::kSerial);
    EXPECT_EQ(ra.loss, rb.loss);
    EXPECT_EQ(ra.loss, rs.loss);
    EXPECT_EQ(ra.microbatch_losses, rs.microbatch_losses);
    EXPECT_EQ(ra.grad_norm, rs.grad_norm);
  }
  for (int s = 0; s < a->num_stages(); ++s) {
    const auto pa = a->stage(StageId(s)).parameters();
    const auto ps = serial->stage(StageId(s)).parameters();
    EXPECT_EQ(std::memcmp(pa.data(), ps.data(), pa.size_bytes()), 0) << "stage " << s;
  }
}

TEST(PipelineEngine, TheLossIsTheMeanOfTheMicrobatchLosses) {
  auto engine = testing::tiny_engine(make_schedule("gpipe", 2, 3));
  const StepResult result = engine->step(0, train_source(), StepMode::kGradientsOnly);
  ASSERT_EQ(result.microbatch_losses.size(), 3u);
  EXPECT_EQ(result.loss, (result.microbatch_losses[0] + result.microbatch_losses[1] + result.microbatch_losses[2]) / 3);
  EXPECT_EQ(result.clip_coefficient, 1.0);  // gradients only: nothing clipped
  // Untrained, the loss is about ln 256 = 5.55 (GPT-2 initialisation).
  EXPECT_NEAR(result.loss, std::log(256.0), 0.05);
}

TEST(PipelineEngine, ClipsToTheConfiguredNormAndFollowsTheLrSchedule) {
  auto engine = testing::tiny_engine(make_schedule("zb-h1", 2, 2));
  const StepResult result = engine->step(0, train_source());
  ASSERT_GT(result.grad_norm, 0.5);
  EXPECT_DOUBLE_EQ(result.clip_coefficient, 0.5 / (result.grad_norm + 1e-6));
  EXPECT_EQ(result.lr, 1e-2);
}

// A source whose micro-batch 2 holds a token outside the vocabulary: the
// first stage fails in the middle of the step while the others wait.
class BadSource final : public BatchSource {
 public:
  nn::Batch batch(std::int64_t step, std::int64_t first, int count, Allocator allocator) const override {
    nn::Batch batch = train_source().batch(step, first, count, allocator);
    if (first == 2 * testing::kMicroBatch) batch.inputs[3] = 300;
    return batch;
  }
};

TEST(PipelineEngine, AFailingWorkerStopsEveryWorkerWithTheOriginalError) {
  auto engine = testing::tiny_engine(make_schedule("1f1b", 4, 4));
  const int threads = thread_count();
  EXPECT_EQ(error_of([&] { engine->step(0, BadSource()); }),
            "stage 0 (embedding..block.0): tokens [0, 3] = 300 is outside the vocabulary [0, 256)");
  EXPECT_EQ(thread_count(), threads + 4);  // the four rank threads, and no other
  // The next step starts clean and computes what a fresh engine computes.
  const double loss = engine->step(0, train_source()).loss;
  EXPECT_EQ(loss, testing::tiny_engine(make_schedule("1f1b", 4, 4))->step(0, train_source()).loss);
}

TEST(PipelineEngine, AWorkerFailingWhileOthersWaitStopsThemAll) {
  EngineOptions options = testing::tiny_options();
  options.before_action = [](RankId rank, const Action& action) {
    if (rank.value() == 3 && action == Action{StageId(3), ActionKind::kBackward, MicrobatchId(1)}) {
      throw Error("injected failure at 3B1");
    }
  };
  PipelineEngine engine(kTiny, make_schedule("1f1b", 4, 6), partition_uniform(kTiny.pipeline_layers(), 4), options);
  const int threads = thread_count();
  EXPECT_EQ(error_of([&] { engine.step(0, train_source()); }), "injected failure at 3B1");
  EXPECT_EQ(thread_count(), threads + 4);  // the four rank threads, and no other
}

// The rank threads start at the first threaded step and serve every later
// one, a failed step included; after the failure the next step computes
// what an engine that never failed computes.
TEST(PipelineEngine, RankThreadsPersistAcrossStepsAndFailures) {
  constexpr int kRanks = 2;
  std::mutex mutex;
  std::vector<std::set<std::thread::id>> ids(kRanks);
  std::atomic<bool> inject{false};
  EngineOptions options = testing::tiny_options();
  options.before_action = [&](RankId rank, const Action& action) {
    {
      std::lock_guard lock(mutex);
      ids[static_cast<std::size_t>(rank.value())].insert(std::this_thread::get_id());
    }
    if (inject.load() && rank.value() == 1 && action == Action{StageId(1), ActionKind::kBackward, MicrobatchId(2)}) {
      throw Error("injected failure at 1B2");
    }
  };
  const Schedule schedule = make_schedule("1f1b", kRanks, 4);
  const auto boundaries = partition_uniform(kTiny.pipeline_layers(), kRanks);
  PipelineEngine engine(kTiny, schedule, boundaries, options);
  engine.init_parameters(11);
  auto never_failed = testing::tiny_engine(schedule);
  engine.step(0, train_source());
  never_failed->step(0, train_source());
  const int threads = thread_count();
  for (int step = 1; step < 3; ++step) {
    engine.step(step, train_source());
    never_failed->step(step, train_source());
  }
  inject = true;
  EXPECT_EQ(error_of([&] { engine.step(3, train_source()); }), "injected failure at 1B2");
  inject = false;
  const StepResult after = engine.step(3, train_source());
  EXPECT_EQ(after.loss, never_failed->step(3, train_source()).loss);
  EXPECT_EQ(thread_count(), threads);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(ids[static_cast<std::size_t>(r)].size(), 1u) << "rank " << r << " ran on more than one thread";
    EXPECT_NE(*ids[static_cast<std::size_t>(r)].begin(), std::this_thread::get_id());
  }
  EXPECT_NE(*ids[0].begin(), *ids[1].begin());
  for (int s = 0; s < kRanks; ++s) {
    const auto pa = engine.stage(StageId(s)).parameters();
    const auto pb = never_failed->stage(StageId(s)).parameters();
    EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size_bytes()), 0) << "stage " << s;
  }
}

TEST(PipelineEngine, ATimeoutNamesTheRankTheActionAndTheMessageAndMarksTheGrid) {
  EngineOptions options = testing::tiny_options();
  options.timeout = 50ms;
  // Rank 0 stalls before 0F1 until rank 1 waits at 1RECV_F1, and then for
  // far longer than the timeout; rank 1 starts its first receive only once
  // rank 0 has sent micro-batch 0 (reached 0F1), so that however slowly a
  // loaded machine runs 0F0, the receive that times out is 1RECV_F1's.
  std::atomic<bool> rank0_at_f1{false};
  std::atomic<bool> rank1_at_recv_f1{false};
  const auto await = [](const std::atomic<bool>& flag) {
    for (int i = 0; i < 10'000 && !flag.load(); ++i) std::this_thread::sleep_for(1ms);
  };
  options.before_action = [&](RankId rank, const Action& action) {
    const bool first = action.microbatch.value() == 0, second = action.microbatch.value() == 1;
    if (rank.value() == 0 && action.kind == ActionKind::kForward && second) {
      rank0_at_f1 = true;
      await(rank1_at_recv_f1);
      std::this_thread::sleep_for(400ms);
    }
    if (rank.value() == 1 && action.kind == ActionKind::kRecvForward && first) await(rank0_at_f1);
    if (rank.value() == 1 && action.kind == ActionKind::kRecvForward && second) rank1_at_recv_f1 = true;
  };
  const Schedule schedule = insert_send_recv(make_schedule("1f1b", 2, 2));
  PipelineEngine engine(kTiny, schedule, partition_uniform(kTiny.pipeline_layers(), 2), options);
  const std::size_t at = 2;  // rank 1: 1RECV_F0 1F0 1RECV_F1 ...
  ASSERT_EQ(to_string(schedule.actions(RankId(1))[at]), "1RECV_F1");
  EXPECT_EQ(error_of([&] { engine.step(0, train_source()); }),
            "rank 1 timed out after 50.0 ms at 1RECV_F1 (step 0, position 2 of 8): waited for the activation of "
            "micro-batch 1 from stage 0 (rank 0 -> rank 1); rank 0 is at 0F1 (position 2). If a stage is only "
            "slow, raise the timeout (pipeflow train --timeout SECONDS).\n" +
                render_grid(schedule, {GridMark{RankId(1), at, 1}}));
}

// The flush waits with a timeout too: rank 1 held up before its last W
// leaves rank 0, done with its actions, waiting for the tied wte gradient.
TEST(PipelineEngine, AFlushTimeoutNamesThePhaseAndWhereTheOthersAre) {
  EngineOptions options = testing::tiny_options();
  options.timeout = 300ms;  // long beside the tiny model's actions, so only the flush waits that long
  options.before_action = [](RankId rank, const Action& action) {
    if (rank.value() == 1 && action.kind == ActionKind::kBackwardWeight && action.microbatch.value() == 1) {
      std::this_thread::sleep_for(1500ms);
    }
  };
  const Schedule schedule = insert_send_recv(make_schedule("zb-h1", 2, 2));
  ASSERT_EQ(to_string(schedule.actions(RankId(1)).back()), "1W1");
  PipelineEngine engine(kTiny, schedule, partition_uniform(kTiny.pipeline_layers(), 2), options);
  const std::string error = error_of([&] { engine.step(0, train_source()); });
  EXPECT_EQ(error.rfind("rank 0 timed out after 300 ms in the tied-gradient reduction (step 0, after its last "
                        "action): waited for the ",
                        0),
            0u)
      << error;
  EXPECT_NE(error.find("rank 1 is at 1W1 (position 9)"), std::string::npos) << error;
  EXPECT_NE(error.find(render_grid(schedule)), std::string::npos) << error;
}

// On three ranks the middle one holds no tied stage, so once its actions are
// done it waits in the gradient-norm all-reduce. Rank 2 held up before its
// last W keeps it there; rank 0, held up a little, starts its own wait (for
// rank 2's tied gradient) later, so rank 1's deadline passes first.
TEST(PipelineEngine, AGradientNormTimeoutNamesThePhaseAndWhereTheOthersAre) {
  EngineOptions options = testing::tiny_options();
  options.timeout = 300ms;
  options.before_action = [](RankId rank, const Action& action) {
    if (action.kind != ActionKind::kBackwardWeight || action.microbatch.value() != 2) return;
    if (rank.value() == 2) std::this_thread::sleep_for(1500ms);
    if (rank.value() == 0) std::this_thread::sleep_for(150ms);
  };
  const Schedule schedule = insert_send_recv(make_schedule("zb-h1", 3, 3));
  const auto& last = schedule.actions(RankId(2));
  ASSERT_EQ(to_string(last.back()), "2W2");
  PipelineEngine engine(kTiny, schedule, partition_uniform(kTiny.pipeline_layers(), 3), options);
  const std::string error = error_of([&] { engine.step(0, train_source()); });
  EXPECT_EQ(error.rfind("rank 1 timed out after 300 ms in the gradient-norm all-reduce (step 0, after its last "
                        "action): waited for every rank's square sum; ",
                        0),
            0u)
      << error;
  EXPECT_NE(error.find(fmt::format("rank 2 is at 2W2 (position {})", last.size() - 1)), std::string::npos) << error;
  EXPECT_NE(error.find(render_grid(schedule)), std::string::npos) << error;
}

TEST(PipelineEngine, SteadyStateStepsAllocateNoBuffers) {
  auto engine = testing::tiny_engine(make_schedule("zbv", 2, 4));
  engine->step(0, train_source(), StepMode::kTrain, RunMode::kSerial);
  const std::int64_t after_first = pool_blocks(*engine);
  EXPECT_GT(after_first, 0);
  engine->step(1, train_source(), StepMode::kTrain, RunMode::kSerial);
  engine->step(2, train_source(), StepMode::kTrain, RunMode::kSerial);
  EXPECT_EQ(pool_blocks(*engine), after_first);
}

// Threaded, which tensor is freed first depends on timing, so the pools' high
// water may rise by a block or two in later steps (measured: 0 to 3 blocks
// over 9 steps, of about 240). Allocating per message or per activation would
// add hundreds per step; the bound is 5% of the first step's blocks.
TEST(PipelineEngine, ThreadedStepsAfterTheFirstAllocateAlmostNoBuffers) {
  for (const Schedule& schedule :
       {make_schedule("1f1b", 2, 4), make_schedule("zbv", 2, 4), make_schedule("interleaved-1f1b", 2, 4, 2)}) {
    auto engine = testing::tiny_engine(schedule);
    engine->step(0, train_source());
    const std::int64_t after_first = pool_blocks(*engine);
    for (int step = 1; step < 10; ++step) engine->step(step, train_source());
    EXPECT_LE(pool_blocks(*engine) - after_first, after_first / 20)
        << schedule.name() << ": " << after_first << " blocks after step 0";
  }
}

// Steps after the first fault in no page the process had not touched: the
// malloc heaps are kept warm for oneDNN's per-call packing buffers
// (gemm.cc) and pool blocks of 64 KiB and more are mapped apart from them
// (buffer_pool.cc). Without either, bench_runtime_pipeline's small model
// took 104, 14 and 14 page faults in steps 1 to 3 (the process's), then
// none (about 10 µs each on a VM: its step 1 was 1.1 ms slower, of 7); with
// the heap warm but the blocks in it, make run's model took 134, 131 and
// 131. Step 1 is checked where this test is the first of its process, as
// ctest runs it: after other tests, the arenas their threads leave for this
// one's are cut up their way, and a step-1 block can still land on a fresh
// page (measured: 261 faults at make run's step 1 after
// ThreadedStepsAfterTheFirstAllocateAlmostNoBuffers). The sanitizers bring
// allocators of their own.
TEST(PipelineEngine, StepsAfterTheFirstFaultInNoNewPage) {
  if (testing::kSanitized) GTEST_SKIP() << "the sanitizers' allocators place blocks their own way";
  const bool first_in_process = ::testing::UnitTest::GetInstance()->successful_test_count() +
                                    ::testing::UnitTest::GetInstance()->failed_test_count() ==
                                0;
  struct Run {
    const char* name;
    nn::ModelConfig model;
    int micro_batch;
  };
  const Run runs[] = {
      {"small", {.vocab_size = 256, .context = 32, .n_layer = 4, .n_head = 4, .n_embd = 64}, 4},
      {"make run's", {.vocab_size = 256, .context = 64, .n_layer = 4, .n_head = 4, .n_embd = 128}, 8},
  };
  for (const Run& run : runs) {
    EngineOptions options = testing::tiny_options();
    options.micro_batch = run.micro_batch;
    options.seq_length = run.model.context;
    PipelineEngine engine(run.model, make_schedule("1f1b", 2, 8), partition_uniform(run.model.pipeline_layers(), 2),
                          options);
    engine.init_parameters(1);
    const nn::ByteDataset data(testing::corpus(), "test corpus", {.seq_length = run.model.context, .seed = 1});
    const DatasetSource source(data, nn::Split::kTrain);
    const auto faults = [] {
      rusage usage{};
      getrusage(RUSAGE_SELF, &usage);
      return usage.ru_minflt + usage.ru_majflt;
    };
    engine.step(0, source);
    for (int step = 1; step < 5; ++step) {
      const long before = faults();
      engine.step(step, source);
      if (step > 1 || first_in_process) {
        EXPECT_EQ(faults() - before, 0) << run.name << " model, step " << step;
      }
    }
  }
}

TEST(PipelineEngine, RejectsPartitionsThatDoNotFitTheSchedule) {
  const Schedule schedule = make_schedule("1f1b", 2, 2);
  EXPECT_EQ(error_of([&] { PipelineEngine(kTiny, schedule, {0, 8}, testing::tiny_options()); }),
            "partition has 2 boundaries for 2 stages: needs stages + 1 = 3 (0 … 8)");
  EXPECT_EQ(error_of([&] { PipelineEngine(kTiny, schedule, {0, 4, 7}, testing::tiny_options()); }),
            "partition boundaries [0, 4, 7] must run from 0 to the model's 8 pipeline layers");
  EXPECT_EQ(error_of([&] { PipelineEngine(kTiny, schedule, {0, 0, 8}, testing::tiny_options()); }),
            "partition boundaries [0, 0, 8] must increase: stage 0 would hold no layer (a schedule of 2 stages needs "
            "at least 2 pipeline layers)");
}

TEST(PipelineEngine, RefusesAnInvalidScheduleWithItsOwnViolations) {
  // Stage 0 on both rows of a CSV: the engine reports the placement on the
  // schedule as written, not the deadlock its lowering would hit.
  const Schedule two_rows = read_csv("0F0,0B0\n0F1,0B1\n", "two_rows.csv");
  const std::string error =
      error_of([&] { PipelineEngine(kTiny, two_rows, {0, 4, 8}, testing::tiny_options()); });
  EXPECT_EQ(error.rfind("schedule two_rows.csv cannot run:\ntwo_rows.csv: 2 ranks, 2 stages (loop placement), 2 "
                        "micro-batches, compute-only, 4 actions\n8 violations:\n[1] placement: rank 1 step 0: 0F1 is "
                        "on rank 1, but stage 0 sits on rank 0",
                        0),
            0u)
      << error;
  EXPECT_NE(error.find("rank 1  *0F1*  *0B1*   <-- ERROR HERE [1] [2] [8]\n"), std::string::npos) << error;
}

TEST(PipelineEngine, AssemblesTheWholeModelFromItsStages) {
  auto engine = testing::tiny_engine(make_schedule("interleaved-1f1b", 2, 2, 2));
  const auto model = engine->assemble_model();
  nn::Stage fresh(kTiny, nn::all_layers(kTiny));
  fresh.init_parameters(11);
  ASSERT_EQ(model->parameters().size(), fresh.parameters().size());
  EXPECT_EQ(std::memcmp(model->parameters().data(), fresh.parameters().data(), fresh.parameters().size_bytes()), 0);
}

}  // namespace
}  // namespace pipeflow::runtime
