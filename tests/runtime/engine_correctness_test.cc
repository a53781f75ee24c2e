// Every schedule, every p in 1..4 it accepts, several m, recompute on and off,
// GPT-2 and Llama: a pipelined step computes what the unpipelined run of the
// same global batch computes in one forward and backward of the whole batch:
// the loss and every gradient after one step, the losses of three training
// steps and the weights after them, each tensor within 1e-5 of its norm.
// Under a sanitizer, each p keeps the smallest and the largest m its schedule
// takes: the sanitizers look for races and bad accesses, which those show;
// the release suite checks every layout's numbers.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "pipeflow/schedule/generators.h"
#include "test_support.h"

namespace pipeflow::runtime {
namespace {

using testing::kTiny;
using testing::kTinyLlama;
using testing::Reference;
using testing::relative_error;

constexpr double kTolerance = 1e-5;

int chunks(const std::string& schedule) {
  return schedule == "interleaved-1f1b" || schedule == "looped-bfs" ? 2 : 1;
}

std::optional<Schedule> try_schedule(const std::string& name, int ranks, int microbatches) {
  try {
    return make_schedule(name, ranks, microbatches, chunks(name));
  } catch (const Error&) {
    return std::nullopt;  // a constraint of the schedule (e.g. m >= p): not a layout to test
  }
}

// Every tensor of every stage (both copies of a tied wte) against the reference.
template <class Read>
void expect_tensors_match(const PipelineEngine& engine, nn::Stage& reference, Read read, const char* what) {
  for (int s = 0; s < engine.num_stages(); ++s) {
    const nn::Stage& stage = engine.stage(StageId(s));
    for (const nn::ParameterInfo& info : stage.layout().entries()) {
      EXPECT_LE(relative_error(read(stage, info.name), read(reference, info.name)), kTolerance)
          << what << " of " << info.name << " on stage " << s;
    }
  }
}

void check_layout(const nn::ModelConfig& model, const std::string& name, int ranks, int microbatches,
                  int recompute_interval) {
  const std::optional<Schedule> schedule = try_schedule(name, ranks, microbatches);
  if (!schedule) return;
  SCOPED_TRACE(fmt::format("{} {} p={} m={} stages={} recompute_interval={}", nn::to_string(model.family), name,
                           ranks, microbatches, schedule->num_stages(), recompute_interval));
  auto engine = testing::tiny_engine(*schedule, recompute_interval, 11, model);
  const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);

  Reference unpipelined(microbatches * testing::kMicroBatch, 11, model);
  const StepResult first = engine->step(0, source, StepMode::kGradientsOnly);
  const double reference_loss = unpipelined.step(0, false);
  EXPECT_NEAR(first.loss, reference_loss, kTolerance * reference_loss);
  EXPECT_NEAR(first.grad_norm, std::sqrt(unpipelined.model().gradient_square_sum()), kTolerance * first.grad_norm);
  expect_tensors_match(*engine, unpipelined.model(),
                       [](const nn::Stage& s, const std::string& n) { return s.gradient(n); }, "gradient");

  for (int step = 0; step < 3; ++step) {
    const double loss = engine->step(step, source).loss;
    EXPECT_NEAR(loss, unpipelined.step(step, true), kTolerance * loss) << "step " << step;
  }
  expect_tensors_match(*engine, unpipelined.model(),
                       [](const nn::Stage& s, const std::string& n) { return s.parameter(n); }, "weights after 3 steps");
}

constexpr int kMicrobatchCounts[] = {1, 2, 3, 4, 5, 8};

// The m of kMicrobatchCounts that the schedule takes at p ranks (all, or under
// a sanitizer the smallest and the largest).
std::vector<int> microbatch_counts(const std::string& name, int ranks) {
  std::vector<int> taken;
  for (int microbatches : kMicrobatchCounts) {
    if (try_schedule(name, ranks, microbatches)) taken.push_back(microbatches);
  }
  if (testing::kSanitized && taken.size() > 2) taken = {taken.front(), taken.back()};
  return taken;
}

void sweep(const std::string& name) {
  for (const nn::ModelConfig& model : {kTiny, kTinyLlama}) {
    for (int ranks = 1; ranks <= 4; ++ranks) {
      for (int microbatches : microbatch_counts(name, ranks)) {
        for (int recompute_interval : {0, 1}) check_layout(model, name, ranks, microbatches, recompute_interval);
      }
    }
  }
}

TEST(PipelineCorrectness, GPipeEqualsUnpipelined) { sweep("gpipe"); }
TEST(PipelineCorrectness, OneFOneBEqualsUnpipelined) { sweep("1f1b"); }
TEST(PipelineCorrectness, Interleaved1F1BEqualsUnpipelined) { sweep("interleaved-1f1b"); }
TEST(PipelineCorrectness, LoopedBfsEqualsUnpipelined) { sweep("looped-bfs"); }
TEST(PipelineCorrectness, ZbH1EqualsUnpipelined) { sweep("zb-h1"); }
TEST(PipelineCorrectness, ZbH2EqualsUnpipelined) { sweep("zb-h2"); }
TEST(PipelineCorrectness, ZbvEqualsUnpipelined) { sweep("zbv"); }
TEST(PipelineCorrectness, DualPipeVEqualsUnpipelined) { sweep("dualpipev"); }

// An untied Llama (lm_head.weight of its own, no tied reduction) through the
// two schedule families: fused B and split I/W.
TEST(PipelineCorrectness, UntiedLlamaEqualsUnpipelined) {
  nn::ModelConfig untied = kTinyLlama;
  untied.tied_embeddings = false;
  for (const char* name : {"1f1b", "zbv"}) {
    for (int ranks = 1; ranks <= 4; ++ranks) check_layout(untied, name, ranks, 4, 0);
  }
}

TEST(PipelineCorrectness, EveryLayoutOfTheSweepRuns) {
  // The sweep skips layouts a schedule rejects; make sure it still covers
  // every schedule at every p it can take.
  for (const ScheduleInfo& info : list_schedules()) {
    if (info.inference) continue;  // forward only: the engine trains
    for (int ranks = 1; ranks <= 4; ++ranks) {
      EXPECT_FALSE(microbatch_counts(info.name, ranks).empty()) << info.name << " p=" << ranks;
    }
  }
}

}  // namespace
}  // namespace pipeflow::runtime
