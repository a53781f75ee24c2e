#include "pipeflow/trace/event.h"

#include <gtest/gtest.h>

#include "pipeflow/core/error.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/io.h"

namespace pipeflow {
namespace {

TEST(Timeline, FromExecutionSplitsWaitsOffSendsAndRecvs) {
  const Schedule lowered = read_csv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", "t.csv");
  ExecutionCosts costs = unit_costs(CommMode::kBlocking);
  costs.transfer = [](const Action&, RankId, RankId) { return 0.5; };
  const Timeline t = timeline_from_execution(lowered, execute(lowered, costs), "two ranks");
  EXPECT_EQ(t.title, "two ranks");
  EXPECT_EQ(t.num_ranks, 2);
  const Action recv{StageId(1), ActionKind::kRecvForward, MicrobatchId(0)};
  // rank 1 waits at 1RECV_F0 until rank 0 sends at 1, then both hold 0.5 for the transfer.
  std::vector<TraceEvent> rank1;
  for (const TraceEvent& e : t.events) {
    if (e.rank == RankId(1)) rank1.push_back(e);
  }
  ASSERT_GE(rank1.size(), 3u);
  EXPECT_EQ(rank1[0], (TraceEvent{RankId(1), "1RECV_F0", EventCategory::kWait, recv, 0, 1}));
  EXPECT_EQ(rank1[1], (TraceEvent{RankId(1), "1RECV_F0", EventCategory::kRecv, recv, 1, 0.5}));
  EXPECT_EQ(rank1[2].category, EventCategory::kForward);
  EXPECT_DOUBLE_EQ(rank1[2].start_s, 1.5);
  EXPECT_DOUBLE_EQ(t.makespan_s(), 7);
}

TEST(Timeline, BubbleCountsOnlyComputeAsBusy) {
  const Schedule schedule = make_1f1b(4, 16);
  const BubbleStats stats = bubble_stats(timeline_from_execution(schedule, dry_run(schedule), "seed"));
  ASSERT_EQ(stats.per_rank.size(), 4u);
  for (double b : stats.per_rank) EXPECT_DOUBLE_EQ(b, 9.0 / 57.0);
  EXPECT_DOUBLE_EQ(stats.overall, 3.0 / 19.0);

  Timeline mixed;
  mixed.num_ranks = 2;
  mixed.events = {{RankId(0), "0F0", EventCategory::kForward, std::nullopt, 1, 2},
                  {RankId(0), "ar", EventCategory::kAllreduce, std::nullopt, 3, 2},
                  {RankId(1), "1B0", EventCategory::kBackward, std::nullopt, 2, 3}};
  const BubbleStats m = bubble_stats(mixed);  // span [1, 5]
  EXPECT_DOUBLE_EQ(m.per_rank[0], 0.5);
  EXPECT_DOUBLE_EQ(m.per_rank[1], 0.25);
  EXPECT_DOUBLE_EQ(m.overall, 1.0 - 5.0 / 8.0);
}

TEST(EventCategory, NamesRoundTripAndUnknownNamesAreRejected) {
  for (int c = 0; c <= static_cast<int>(EventCategory::kOther); ++c) {
    const auto category = static_cast<EventCategory>(c);
    EXPECT_EQ(parse_event_category(to_string(category)), category);
  }
  EXPECT_EQ(to_string(category_of(ActionKind::kSendBackward)), "send");
  EXPECT_EQ(to_string(category_of(ActionKind::kBackwardInput)), "backward_input");
  try {
    parse_event_category("fwd");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "unknown event category \"fwd\": expected forward, backward, backward_input, backward_weight, send, "
                 "recv, wait, allreduce, tensor_parallel, optimizer or other");
  }
}

}  // namespace
}  // namespace pipeflow
