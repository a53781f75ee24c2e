#include "pipeflow/schedule/validate.h"

#include <gtest/gtest.h>

#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/io.h"
#include "pipeflow/schedule/passes.h"

namespace pipeflow {
namespace {

// A schedule from one string per rank ("0F0 0B0"), with explicit shape.
Schedule hand(int ranks, int stages, int microbatches, Placement placement, std::vector<std::string> rows) {
  Schedule schedule("hand", ranks, stages, microbatches, placement);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::string_view row = rows[r];
    while (!row.empty()) {
      const std::size_t space = row.find(' ');
      schedule.add(RankId(static_cast<int>(r)), parse_action(row.substr(0, space)));
      if (space == std::string_view::npos) break;
      row.remove_prefix(space + 1);
    }
  }
  return schedule;
}

std::vector<std::string> messages(const ValidationReport& report) {
  std::vector<std::string> out;
  for (const Violation& v : report.violations) out.push_back(v.rule + ": " + v.message);
  return out;
}

using Messages = std::vector<std::string>;

TEST(Validate, GoodScheduleHasNoViolationsAndASummary) {
  const Schedule schedule = make_1f1b(4, 16);
  const ValidationReport report = validate(schedule);
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.summary(schedule),
            "1f1b: 4 ranks, 4 stages (loop placement), 16 micro-batches, compute-only, 128 actions\n"
            "unit-cost makespan 57 (F=1, B=2, I=W=1, no transfer time), bubble 15.8%\n"
            "peak in-flight micro-batch chunks per rank: 4 3 2 1\n");
}

// An inference schedule runs forwards only: the same forwards that are a
// training schedule missing its backwards are a valid inference schedule,
// and a backward in an inference schedule is the violation.
TEST(Validate, InferenceScheduleHasNoBackward) {
  Schedule forwards = hand(2, 2, 2, Placement::kLoop, {"0F0 0F1", "1F0 1F1"});
  EXPECT_EQ(messages(validate(forwards)),
            (Messages{"count: rank 0 step 0: stage 0 micro-batch 0 has no backward: it needs 0B0, or 0I0 and 0W0",
                      "count: rank 0 step 1: stage 0 micro-batch 1 has no backward: it needs 0B1, or 0I1 and 0W1",
                      "count: rank 1 step 0: stage 1 micro-batch 0 has no backward: it needs 1B0, or 1I0 and 1W0",
                      "count: rank 1 step 1: stage 1 micro-batch 1 has no backward: it needs 1B1, or 1I1 and 1W1"}));
  forwards.set_inference(true);
  const ValidationReport report = validate(forwards);
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.summary(forwards),
            "hand: inference (forward only), 2 ranks, 2 stages (loop placement), 2 micro-batches, compute-only, 4 "
            "actions\n"
            "unit-cost makespan 3 (F=1, B=2, I=W=1, no transfer time), bubble 33.3%\n"
            "forward only: no activation is kept for a backward\n");

  Schedule with_backward = hand(1, 1, 2, Placement::kLoop, {"0F0 0B0 0F1 0I1 0W1"});
  with_backward.set_inference(true);
  EXPECT_EQ(messages(validate(with_backward)),
            (Messages{"forward-only: rank 0 step 1: 0B0 is a backward, but an inference schedule runs forwards only: "
                      "remove it, or mark the schedule as training",
                      "forward-only: rank 0 step 3: 0I1 is a backward, but an inference schedule runs forwards only: "
                      "remove it, or mark the schedule as training",
                      "forward-only: rank 0 step 4: 0W1 is a backward, but an inference schedule runs forwards only: "
                      "remove it, or mark the schedule as training"}));
  Schedule missing_forward = hand(1, 1, 2, Placement::kLoop, {"0F0"});
  missing_forward.set_inference(true);
  EXPECT_EQ(messages(validate(missing_forward)), Messages{"count: stage 0 micro-batch 1 has no forward (0F1)"});
}

// JSON carries the mark; a CSV cannot, and reads as training.
TEST(Validate, InferenceMarkRoundTripsThroughJsonNotCsv) {
  const Schedule schedule = make_schedule("inference", 3, 4);
  const std::string json = write_json(schedule);
  EXPECT_NE(json.find("\"inference\": true,"), std::string::npos);
  const Schedule read = read_json(json, "x.json");
  EXPECT_TRUE(read.is_inference());
  EXPECT_TRUE(validate(read).ok());
  EXPECT_EQ(write_json(make_schedule("1f1b", 3, 4)).find("inference"), std::string::npos);
  EXPECT_FALSE(read_json(write_json(make_schedule("1f1b", 3, 4)), "y.json").is_inference());
  const Schedule csv = read_csv(write_csv(schedule), "x.csv");
  EXPECT_FALSE(csv.is_inference());
  EXPECT_EQ(validate(csv).violations.size(), 12u);  // every (stage, micro-batch) lacks its backward
}

TEST(Validate, SplitBackwardSummaryAlsoCountsUntilW) {
  const Schedule schedule = make_zb_h1(2, 2);
  const ValidationReport report = validate(schedule);
  EXPECT_TRUE(report.ok());
  EXPECT_TRUE(report.split_backward);
  EXPECT_EQ(report.summary(schedule),
            "zb-h1: 2 ranks, 2 stages (loop placement), 2 micro-batches, compute-only, 12 actions\n"
            "unit-cost makespan 7 (F=1, B=2, I=W=1, no transfer time), bubble 14.3%\n"
            "peak in-flight micro-batch chunks per rank: 2 1\n"
            "peak in-flight until W per rank: 2 2\n");
}

TEST(Validate, OutOfRangeActionsAreReportedAndSkipTheDryRun) {
  const ValidationReport report = validate(hand(1, 1, 1, Placement::kLoop, {"0F0 0B0 0F3"}));
  EXPECT_EQ(messages(report), Messages{"range: rank 0 step 2: 0F3 lies outside the schedule's stages 0..0 and "
                                       "micro-batches 0..0"});
  EXPECT_FALSE(report.dry_run.has_value());
}

TEST(Validate, ActionOnTheWrongRank) {
  const ValidationReport report = validate(hand(2, 2, 1, Placement::kLoop, {"1F0 0B0", "0F0 1B0"}));
  const Messages got = messages(report);
  ASSERT_GE(got.size(), 2u);
  EXPECT_EQ(got[0],
            "placement: rank 0 step 0: 1F0 is on rank 0, but stage 1 sits on rank 1 (loop placement: stage s on "
            "rank s % 2): move it to rank 1 or correct its stage");
  EXPECT_EQ(got[1],
            "placement: rank 1 step 0: 0F0 is on rank 1, but stage 0 sits on rank 0 (loop placement: stage s on "
            "rank s % 2): move it to rank 0 or correct its stage");
  // V on 2 ranks: rank 0 holds stages 0 and 3, rank 1 holds 1 and 2.
  const ValidationReport v = validate(hand(2, 4, 1, Placement::kV, {"0F0 1F0", "2F0 3F0"}));
  EXPECT_EQ(messages(v).at(0),
            "placement: rank 0 step 1: 1F0 is on rank 0, but stage 1 sits on rank 1 (v placement: rank r holds "
            "stages r and 3 - r): move it to rank 1 or correct its stage");
}

TEST(Validate, CountsEveryMissingAndDoubledAction) {
  const ValidationReport report =
      validate(hand(1, 1, 5, Placement::kLoop, {"0F0 0F0 0B0 0B1 0F2 0F3 0B3 0I3 0W3 0F4 0I4"}));
  EXPECT_EQ(messages(report),
            (Messages{
                "count: rank 0 step 1: 0F0 appears twice (first at rank 0 step 0): each action runs once",
                "count: rank 0 step 3: stage 0 micro-batch 1 has no forward (0F1)",
                "count: rank 0 step 4: stage 0 micro-batch 2 has no backward: it needs 0B2, or 0I2 and 0W2",
                "count: rank 0 step 7: stage 0 micro-batch 3 has both a full backward B and a split one (I/W): use "
                "one or the other",
                "count: rank 0 step 10: stage 0 micro-batch 4 has 0I4 but no 0W4: a split backward needs both",
                "deadlock: rank 0 blocked at 0B1: waits for 0F1, which is in no rank's list",
            }));
}

TEST(Validate, BackwardBeforeForwardAndWBeforeI) {
  const ValidationReport report = validate(hand(1, 1, 2, Placement::kLoop, {"0B0 0F0 0F1 0W1 0I1"}));
  EXPECT_EQ(messages(report),
            (Messages{
                "order: rank 0 step 0: 0B0 runs before 0F0 (step 1): a stage's backward needs its forward first",
                "order: rank 0 step 3: 0W1 runs before 0I1 (step 4): W needs the I of its micro-batch first",
                "deadlock: rank 0 blocked at 0B0: waits for 0F0, which comes later in its own list (step 1)",
            }));
}

TEST(Validate, SameRankStagesMustRunInDataFlowOrder) {
  // One rank holding stages 0 and 1 (interleaved, p = 1, v = 2).
  const ValidationReport report = validate(hand(1, 2, 1, Placement::kLoop, {"1F0 0F0 0B0 1B0"}));
  EXPECT_EQ(messages(report),
            (Messages{
                "dependency: rank 0 step 2: 0B0 runs before 1B0 (step 3): stage 0's backward needs stage 1's "
                "input gradient",
                "dependency: rank 0 step 0: 1F0 runs before 0F0 (step 1): stage 1's forward needs stage 0's output",
                "deadlock: rank 0 blocked at 1F0: waits for 0F0, which comes later in its own list (step 1)",
            }));
}

TEST(Validate, EveryCrossRankDependencyNeedsItsSendAndRecv) {
  // 1F1B on 2 ranks, 1 micro-batch, lowered, then broken: no 0SEND_F0, and
  // 0RECV_B0 after the backward that needs it.
  const ValidationReport report =
      validate(hand(2, 2, 1, Placement::kLoop, {"0F0 0B0 0RECV_B0", "1RECV_F0 1F0 1B0 1SEND_B0"}));
  EXPECT_EQ(messages(report),
            (Messages{
                "comm: rank 1 step 0: 1RECV_F0 has no partner 0SEND_F0 on rank 0: every RECV_F pairs with one SEND_F",
                "comm: rank 0 step 0: 0F0 feeds stage 1 on another rank but no 0SEND_F0 follows it",
                "comm: rank 0 step 2: 0RECV_B0 comes after its consumer 0B0 (step 1): receive before use",
                "deadlock: rank 0 blocked at 0B0: waits for 0RECV_B0, which comes later in its own list (step 2)",
                "deadlock: rank 1 blocked at 1RECV_F0: waits for 0SEND_F0, which is in no rank's list",
            }));
}

TEST(Validate, MessagesMustCrossRanksBetweenRealStages) {
  const ValidationReport report = validate(
      hand(1, 2, 1, Placement::kLoop, {"0F0 0SEND_F0 1RECV_F0 1F0 1SEND_F0 1B0 0B0 0RECV_B0"}));
  EXPECT_EQ(messages(report),
            (Messages{
                "comm: rank 0 step 1: 0SEND_F0 carries no cross-rank dependency: stages 0 and 1 share rank 0; "
                "remove it",
                "comm: rank 0 step 2: 1RECV_F0 carries no cross-rank dependency: stages 0 and 1 share rank 0; "
                "remove it",
                "comm: rank 0 step 4: 1SEND_F0 has no partner: stage 1 is the last stage",
                "comm: rank 0 step 7: 0RECV_B0 carries no cross-rank dependency: stages 0 and 1 share rank 0; "
                "remove it",
                "deadlock: rank 0 blocked at 0SEND_F0: waits for 1RECV_F0 to rendezvous, which comes later in its "
                "own list (step 2)",
            }));
}

TEST(Validate, DeadlockRenderShowsTheGridWithTheCellsMarked) {
  const Schedule schedule = read_csv("0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", "deadlock.csv");
  const ValidationReport report = validate(schedule);
  EXPECT_EQ(report.render(schedule),
            "deadlock.csv: 2 ranks, 2 stages (loop placement), 1 micro-batch, lowered, 8 actions\n"
            "2 violations:\n"
            "[1] deadlock: rank 0 blocked at 0RECV_B0: waits for 1SEND_B0, which rank 1 has not reached (rank 1 "
            "is blocked at 1RECV_F0)\n"
            "[2] deadlock: rank 1 blocked at 1RECV_F0: waits for 0SEND_F0, which rank 0 has not reached (rank 0 "
            "is blocked at 0RECV_B0)\n"
            "\n"
            "step     0          1          2          3\n"
            "rank 0  *0RECV_B0*  0F0        0SEND_F0   0B0   <-- ERROR HERE [1]\n"
            "rank 1  *1RECV_F0*  1F0        1B0        1SEND_B0   <-- ERROR HERE [2]\n");
}

TEST(Validate, LoweredGeneratorsPassAndRecvsAreCounted) {
  const Schedule lowered = insert_send_recv(make_zbv(2, 4));
  const ValidationReport report = validate(lowered);
  EXPECT_TRUE(report.ok()) << report.render(lowered);
  EXPECT_EQ(report.peak_inflight, (std::vector<int>{4, 4}));
}

}  // namespace
}  // namespace pipeflow

namespace pipeflow {
namespace {

// A mistyped micro-batch index (fuzzing found one: 1B666667 in a 4 x 8 CSV)
// breaks the count rule for every index below it; the report lists the
// first kMaxListed and counts the rest (it took over 1 GB listing them all).
TEST(Validate, ListsAtMostKMaxListedViolationsAndCountsTheRest) {
  Schedule schedule("typo", 1, 1, 1000, Placement::kLoop);
  schedule.add(RankId(0), {StageId(0), ActionKind::kForward, MicrobatchId(0)});
  schedule.add(RankId(0), {StageId(0), ActionKind::kBackward, MicrobatchId(0)});
  const ValidationReport report = validate(schedule);
  EXPECT_FALSE(report.ok());
  ASSERT_EQ(report.violations.size(), ValidationReport::kMaxListed);
  EXPECT_EQ(report.violations.size() + report.unlisted, 2 * 999u);  // micro-batches 1..999: no F, no B
  EXPECT_NE(report.render(schedule).find("1998 violations (the first 200 listed):"), std::string::npos);
}

}  // namespace
}  // namespace pipeflow
