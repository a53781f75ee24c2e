#include "pipeflow/schedule/schedule.h"

#include <gtest/gtest.h>

namespace pipeflow {
namespace {

Action act(int stage, ActionKind kind, int microbatch) { return {StageId(stage), kind, MicrobatchId(microbatch)}; }

// Loop placement, 2 chunks on 3 ranks: stage s on rank s % 3.
TEST(PeerRank, LoopPlacementIsTheRankOfTheNeighbourStage) {
  const Schedule schedule("loop", 3, 6, 4, Placement::kLoop);
  EXPECT_EQ(schedule.peer_rank(act(2, ActionKind::kSendForward, 0)), RankId(0));   // to stage 3
  EXPECT_EQ(schedule.peer_rank(act(3, ActionKind::kRecvForward, 0)), RankId(2));   // from stage 2
  EXPECT_EQ(schedule.peer_rank(act(3, ActionKind::kSendBackward, 1)), RankId(2));  // to stage 2
  EXPECT_EQ(schedule.peer_rank(act(1, ActionKind::kRecvBackward, 1)), RankId(2));  // from stage 2
}

// V placement on 2 ranks: stages 0, 3 on rank 0 and 1, 2 on rank 1. The turn
// 1 -> 2 stays on rank 1, and the last stage sits on rank 0 again.
TEST(PeerRank, VPlacementTurnsOnTheLastRankAndEndsOnTheFirst) {
  const Schedule schedule("v", 2, 4, 4, Placement::kV);
  EXPECT_EQ(schedule.peer_rank(act(1, ActionKind::kSendForward, 0)), RankId(1));
  EXPECT_EQ(schedule.peer_rank(act(3, ActionKind::kRecvForward, 0)), RankId(1));
  EXPECT_EQ(schedule.peer_rank(act(3, ActionKind::kSendBackward, 0)), RankId(1));
  EXPECT_EQ(schedule.peer_rank(act(0, ActionKind::kRecvBackward, 0)), RankId(1));
}

TEST(PeerRank, TheFirstStageHasNoPeerBehindItAndTheLastNoneAhead) {
  const Schedule schedule("loop", 2, 4, 2, Placement::kLoop);
  EXPECT_EQ(schedule.peer_rank(act(0, ActionKind::kRecvForward, 0)), std::nullopt);
  EXPECT_EQ(schedule.peer_rank(act(0, ActionKind::kSendBackward, 0)), std::nullopt);
  EXPECT_EQ(schedule.peer_rank(act(3, ActionKind::kSendForward, 0)), std::nullopt);
  EXPECT_EQ(schedule.peer_rank(act(3, ActionKind::kRecvBackward, 0)), std::nullopt);
  EXPECT_EQ(schedule.peer_rank(act(0, ActionKind::kSendForward, 0)), RankId(1));
  EXPECT_EQ(schedule.peer_rank(act(3, ActionKind::kSendBackward, 0)), RankId(0));
}

TEST(PeerRank, OneRankIsItsOwnPeer) {
  const Schedule schedule("single", 1, 2, 1, Placement::kLoop);
  EXPECT_EQ(schedule.peer_rank(act(0, ActionKind::kSendForward, 0)), RankId(0));
}

}  // namespace
}  // namespace pipeflow
