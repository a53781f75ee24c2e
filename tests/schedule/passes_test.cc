#include "pipeflow/schedule/passes.h"

#include <gtest/gtest.h>

#include "../support/error_of.h"
#include "pipeflow/core/error.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/io.h"
#include "pipeflow/schedule/validate.h"

namespace pipeflow {
namespace {

using testing::error_of;

TEST(InsertSendRecv, OneFOneBOnTwoRanks) {
  EXPECT_EQ(write_csv(insert_send_recv(make_1f1b(2, 2))),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\r\n"
            "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1\r\n");
}

TEST(InsertSendRecv, SameRankDependenciesGetNoMessages) {
  // The V turn: stages p - 1 and p are both on rank p - 1.
  const Schedule lowered = insert_send_recv(make_zbv(3, 6));
  for (const Action& a : lowered.actions(RankId(2))) {
    if (!is_communication(a.kind)) continue;
    EXPECT_NE(a.kind == ActionKind::kSendForward && a.stage == StageId(2), true) << to_string(a);
    EXPECT_NE(a.kind == ActionKind::kRecvForward && a.stage == StageId(3), true) << to_string(a);
    EXPECT_NE(a.kind == ActionKind::kSendBackward && a.stage == StageId(3), true) << to_string(a);
    EXPECT_NE(a.kind == ActionKind::kRecvBackward && a.stage == StageId(2), true) << to_string(a);
  }
  EXPECT_FALSE(insert_send_recv(make_interleaved_1f1b(1, 4, 3)).has_communication());
}

TEST(InsertSendRecv, AddsExactlyOnePairPerCrossRankDependency) {
  // 1F1B, p = 4, m = 8: 3 rank boundaries x 8 micro-batches x (forward, backward) x (SEND, RECV).
  const Schedule lowered = insert_send_recv(make_1f1b(4, 8));
  EXPECT_EQ(lowered.total_actions(), 4u * 16u + 3u * 8u * 2u * 2u);
  // ZB-V, p = 3: 2 * 3 - 1 stage boundaries, of which one (the V turn) stays on a rank.
  EXPECT_EQ(insert_send_recv(make_zbv(3, 6)).total_actions(), 3u * 2u * 6u * 3u + 4u * 6u * 2u * 2u);
}

TEST(InsertSendRecv, MessagesWaitForAMomentBothRanksAreBetweenActions) {
  // Where no such moment exists (interleaved 1F1B, DualPipeV) a rendezvous
  // stalls one side; placing each message at the earliest common gap keeps
  // the stall to these makespans (ideal: 72 and 51). Placing every message at
  // its producer's end instead gives 83 and 59.
  EXPECT_EQ(dry_run(insert_send_recv(make_interleaved_1f1b(5, 10, 2))).makespan, 77);
  EXPECT_EQ(dry_run(insert_send_recv(make_dualpipev(4, 8))).makespan, 54);
}

TEST(InsertSendRecv, StrippingTheMessagesGivesTheScheduleBack) {
  for (const Schedule& s : {make_dualpipev(3, 7), make_interleaved_1f1b(3, 5, 3), make_zb_h2(4, 9)}) {
    const Schedule back = strip_communication(insert_send_recv(s));
    for (int r = 0; r < s.num_ranks(); ++r) EXPECT_EQ(back.actions(RankId(r)), s.actions(RankId(r))) << s.name();
  }
}

TEST(InsertSendRecv, RefusesLoweredAndDeadlockingInput) {
  const Schedule lowered = insert_send_recv(make_gpipe(2, 2));
  EXPECT_EQ(error_of([&] { insert_send_recv(lowered); }),
            "insert_send_recv: gpipe already has SEND/RECV actions; lower a compute-only schedule");
  const Schedule crossed = read_csv("0B0,0F0\n1F0,1B0\n", "crossed.csv");
  EXPECT_EQ(error_of([&] { insert_send_recv(crossed); }),
            "cannot insert send/recv into crossed.csv: its compute-only order deadlocks:\n"
            "rank 0 blocked at 0B0: waits for 0F0, which comes later in its own list (step 1)\n"
            "rank 1 blocked at 1F0: waits for 0F0, which rank 0 has not reached (rank 0 is blocked at 0B0)");
}

TEST(MergeBw, AdjacentIAndWBecomeOneB) {
  const Schedule merged = merge_bw(read_csv("0F0,0I0,0W0,0F1,0I1,0F2,0W1,0I2,0W2\n", "split.csv"));
  EXPECT_EQ(write_csv(merged), "0F0,0B0,0F1,0I1,0F2,0W1,0B2\r\n");
}

TEST(MergeBw, MergedSplitSchedulesStillValidate) {
  for (const Schedule& s : {make_zbv(4, 8), make_zb_h1(4, 6), make_zb_h2(3, 7), make_dualpipev(3, 6)}) {
    const Schedule merged = merge_bw(s);
    const ValidationReport report = validate(merged);
    EXPECT_TRUE(report.ok()) << report.render(merged);
    EXPECT_TRUE(validate(insert_send_recv(merged)).ok()) << s.name();
  }
  // ZB-V's steady state F0 I0 W0 F1 I1 W1 becomes F0 B0 F1 B1.
  const Schedule merged = merge_bw(make_zbv(1, 2));
  EXPECT_EQ(write_csv(merged), "0F0,1F0,1B0,0F1,0B0,1F1,1B1,0B1\r\n");
  EXPECT_EQ(write_csv(merge_bw(make_1f1b(3, 3))), write_csv(make_1f1b(3, 3)));
}

}  // namespace
}  // namespace pipeflow
