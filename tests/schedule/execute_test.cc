#include "pipeflow/schedule/execute.h"

#include <gtest/gtest.h>

#include "pipeflow/core/error.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/io.h"

namespace pipeflow {
namespace {

Schedule two_ranks(std::string_view csv) { return read_csv(csv, "test.csv"); }

ExecutionCosts costs_with_transfer(double transfer, CommMode mode) {
  ExecutionCosts costs = unit_costs(mode);
  costs.transfer = [transfer](const Action&, RankId, RankId) { return transfer; };
  return costs;
}

void expect_timed(const TimedAction& t, std::string_view action, double start, double end, double wait) {
  EXPECT_EQ(to_string(t.action), action);
  EXPECT_DOUBLE_EQ(t.start, start) << action;
  EXPECT_DOUBLE_EQ(t.end, end) << action;
  EXPECT_DOUBLE_EQ(t.wait, wait) << action;
}

TEST(Execute, ComputeOnlyInputsArriveAfterTransferWithoutRankTime) {
  const Execution e = execute(two_ranks("0F0,0B0\n1F0,1B0\n"), costs_with_transfer(0.5, CommMode::kOverlapped));
  ASSERT_FALSE(e.deadlocked);
  expect_timed(e.ranks[0][0], "0F0", 0, 1, 0);
  expect_timed(e.ranks[1][0], "1F0", 1.5, 2.5, 0);
  expect_timed(e.ranks[1][1], "1B0", 2.5, 4.5, 0);
  expect_timed(e.ranks[0][1], "0B0", 5, 7, 0);
  EXPECT_DOUBLE_EQ(e.makespan, 7);
}

TEST(Execute, OverlappedSendTakesNoTimeAndRecvWaitsForArrival) {
  const Schedule lowered = two_ranks("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  const Execution e = execute(lowered, costs_with_transfer(0.5, CommMode::kOverlapped));
  ASSERT_FALSE(e.deadlocked);
  expect_timed(e.ranks[0][1], "0SEND_F0", 1, 1, 0);
  expect_timed(e.ranks[1][0], "1RECV_F0", 0, 1.5, 1.5);
  expect_timed(e.ranks[1][1], "1F0", 1.5, 2.5, 0);
  expect_timed(e.ranks[1][3], "1SEND_B0", 4.5, 4.5, 0);
  expect_timed(e.ranks[0][2], "0RECV_B0", 1, 5, 4);
  expect_timed(e.ranks[0][3], "0B0", 5, 7, 0);
}

TEST(Execute, BlockingSendAndRecvMeetAndBothHoldTheirRanks) {
  const Schedule lowered = two_ranks("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  const Execution e = execute(lowered, costs_with_transfer(0.5, CommMode::kBlocking));
  ASSERT_FALSE(e.deadlocked);
  expect_timed(e.ranks[0][1], "0SEND_F0", 1, 1.5, 0);
  expect_timed(e.ranks[1][0], "1RECV_F0", 0, 1.5, 1);
  expect_timed(e.ranks[1][1], "1F0", 1.5, 2.5, 0);
  expect_timed(e.ranks[1][3], "1SEND_B0", 4.5, 5, 0);
  expect_timed(e.ranks[0][2], "0RECV_B0", 1.5, 5, 3);
  expect_timed(e.ranks[0][3], "0B0", 5, 7, 0);
  EXPECT_DOUBLE_EQ(e.makespan, 7);
}

TEST(Execute, BothRanksReceivingFirstDeadlocksAndNamesBoth) {
  const Schedule lowered = two_ranks("0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  for (CommMode mode : {CommMode::kOverlapped, CommMode::kBlocking}) {
    const Execution e = execute(lowered, unit_costs(mode));
    ASSERT_TRUE(e.deadlocked);
    ASSERT_EQ(e.stuck.size(), 2u);
    EXPECT_EQ(e.stuck[0].rank, RankId(0));
    EXPECT_EQ(e.stuck[0].index, 0u);
    EXPECT_EQ(e.deadlock_message(),
              "rank 0 blocked at 0RECV_B0: waits for 1SEND_B0, which rank 1 has not reached (rank 1 is blocked at "
              "1RECV_F0)\n"
              "rank 1 blocked at 1RECV_F0: waits for 0SEND_F0, which rank 0 has not reached (rank 0 is blocked at "
              "0RECV_B0)");
    EXPECT_TRUE(e.ranks[0].empty());
  }
}

TEST(Execute, HeadToHeadSendsDeadlockOnlyUnderRendezvous) {
  const Schedule lowered = two_ranks(
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
  const Execution overlapped = execute(lowered, unit_costs(CommMode::kOverlapped));
  EXPECT_FALSE(overlapped.deadlocked);
  EXPECT_DOUBLE_EQ(overlapped.makespan, 9);
  const Execution blocking = execute(lowered, unit_costs(CommMode::kBlocking));
  ASSERT_TRUE(blocking.deadlocked);
  EXPECT_EQ(blocking.deadlock_message(),
            "rank 0 blocked at 0SEND_F1: waits for 1RECV_F1 to rendezvous, which rank 1 has not reached (rank 1 "
            "is blocked at 1SEND_B0)\n"
            "rank 1 blocked at 1SEND_B0: waits for 0RECV_B0 to rendezvous, which rank 0 has not reached (rank 0 "
            "is blocked at 0SEND_F1)");
  EXPECT_EQ(blocking.ranks[0].size(), 3u);
}

TEST(Execute, BackwardBeforeItsForwardOnTheSameRankIsStuck) {
  const Execution e = execute(two_ranks("0B0,0F0\n"), unit_costs(CommMode::kOverlapped));
  ASSERT_TRUE(e.deadlocked);
  EXPECT_EQ(e.deadlock_message(), "rank 0 blocked at 0B0: waits for 0F0, which comes later in its own list (step 1)");
}

TEST(Execute, WeightPassWaitsForItsInputPass) {
  const Execution e = execute(two_ranks("0F0,0W0,0I0\n"), unit_costs(CommMode::kOverlapped));
  ASSERT_TRUE(e.deadlocked);
  EXPECT_EQ(e.deadlock_message(), "rank 0 blocked at 0W0: waits for 0I0, which comes later in its own list (step 2)");
}

TEST(Execute, ASendBeforeItsProducerIsStuckEvenWhenItsRecvIsWaiting) {
  const Schedule lowered = two_ranks("0SEND_F0,0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  const Execution e = execute(lowered, unit_costs(CommMode::kBlocking));
  ASSERT_TRUE(e.deadlocked);
  EXPECT_EQ(e.deadlock_message(),
            "rank 0 blocked at 0SEND_F0: waits for 0F0, which comes later in its own list (step 1)\n"
            "rank 1 blocked at 1RECV_F0: waits for 0SEND_F0, at which rank 0 is blocked");
}

TEST(Execute, AMissingProducerIsNamed) {
  Schedule schedule("hand", 2, 2, 1, Placement::kLoop);
  schedule.add(RankId(1), Action{StageId(1), ActionKind::kForward, MicrobatchId(0)});
  const Execution e = execute(schedule, unit_costs(CommMode::kOverlapped));
  EXPECT_EQ(e.deadlock_message(), "rank 1 blocked at 1F0: waits for 0F0, which is in no rank's list");
}

TEST(Execute, SeedExampleOneFOneBBubble) {
  // p = 4, m = 16: (p - 1)/(m + p - 1) = 3/19 = 15.8%; p = 8: m = 32 -> 7/39, m = 64 -> 7/71.
  const Execution e = dry_run(make_1f1b(4, 16));
  EXPECT_DOUBLE_EQ(e.makespan, 57);
  EXPECT_DOUBLE_EQ(bubble_fraction(e), 3.0 / 19.0);
  for (int r = 0; r < 4; ++r) EXPECT_DOUBLE_EQ(busy_time(e, RankId(r)), 48);
  EXPECT_DOUBLE_EQ(bubble_fraction(dry_run(make_1f1b(8, 32))), 7.0 / 39.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(dry_run(make_1f1b(8, 64))), 7.0 / 71.0);
}

TEST(Execute, RerunsAreBitIdentical) {
  const Schedule schedule = make_interleaved_1f1b(4, 8, 2);
  ExecutionCosts costs = unit_costs(CommMode::kOverlapped);
  costs.duration = [](const Action& a, RankId r) { return 0.1 * (1 + a.stage.value()) + 0.01 * r.value(); };
  costs.transfer = [](const Action&, RankId from, RankId to) { return 0.003 * (1 + from.value() + to.value()); };
  const Execution a = execute(schedule, costs);
  const Execution b = execute(schedule, costs);
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (std::size_t r = 0; r < a.ranks.size(); ++r) {
    ASSERT_EQ(a.ranks[r].size(), b.ranks[r].size());
    for (std::size_t i = 0; i < a.ranks[r].size(); ++i) {
      EXPECT_EQ(a.ranks[r][i].start, b.ranks[r][i].start);
      EXPECT_EQ(a.ranks[r][i].end, b.ranks[r][i].end);
    }
  }
  EXPECT_EQ(a.makespan, b.makespan);
}

TEST(Execute, ActionsOutsideTheScheduleAreRejected) {
  Schedule schedule("hand", 1, 1, 1, Placement::kLoop);
  schedule.add(RankId(0), Action{StageId(0), ActionKind::kForward, MicrobatchId(3)});
  try {
    execute(schedule, unit_costs(CommMode::kOverlapped));
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "cannot execute hand: 0F3 on rank 0 step 0 lies outside its 1 stages and 1 micro-batches (run "
                 "validate first)");
  }
}

}  // namespace
}  // namespace pipeflow
