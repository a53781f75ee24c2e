#include "pipeflow/trace/torch_trace.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

using nlohmann::json;

json x_event(const std::string& name, double ts, double dur, const std::string& cat = "user_annotation") {
  return {{"ph", "X"}, {"cat", cat}, {"name", name}, {"pid", 7}, {"tid", 7}, {"ts", ts}, {"dur", dur}};
}

json kineto(int rank, json events, double base_ns = 0) {
  json trace = {{"schemaVersion", 1},
                {"distributedInfo", {{"backend", "nccl"}, {"rank", rank}, {"world_size", 2}}},
                {"traceEvents", std::move(events)}};
  if (base_ns > 0) trace["baseTimeNanoseconds"] = base_ns;
  return trace;
}

std::vector<std::string> names(const std::vector<TraceEvent>& events) {
  std::vector<std::string> out;
  for (const TraceEvent& e : events) out.push_back(e.name + ":" + std::string(to_string(e.category)));
  return out;
}

TEST(TorchTrace, ReadsPipeliningLabelsAndTellsTheLayout) {
  const json legacy = json::array({x_event("ProfilerStep#4", 0, 100), x_event("PP:1F0", 10, 20),
                                   x_event("aten::mm", 12, 5, "cpu_op"), x_event("PP:1SEND_F0", 30, 2),
                                   x_event("PP:0REDUCE_GRAD", 80, 10), x_event("PP:1FOO3", 95, 1),
                                   x_event("Optimizer.step#AdamW.step", 90, 9)});
  const RankTrace t = read_torch_trace(legacy, "rank1_trace.json", 1);
  EXPECT_EQ(t.layout, "legacy profiler");
  EXPECT_EQ(t.rank, 1);
  EXPECT_EQ(names(t.events), (std::vector<std::string>{"PP:1F0:forward", "PP:1SEND_F0:send",
                                                       "PP:0REDUCE_GRAD:allreduce", "Optimizer.step#AdamW.step:optimizer"}));
  EXPECT_EQ(t.events[0].action, parse_action("1F0"));
  EXPECT_DOUBLE_EQ(t.events[0].start_s, 10e-6);
  EXPECT_DOUBLE_EQ(t.events[0].duration_s, 20e-6);
  ASSERT_EQ(t.steps.size(), 1u);
  EXPECT_EQ(t.steps[0].number, 4);
  EXPECT_EQ(t.unread_actions, 1);
}

TEST(TorchTrace, HostTransfersOutsideActionsCountOncePerTransfer) {
  // c10d's op and gloo's span inside it are one receive; a send inside an action is overlapped.
  const RankTrace t = read_torch_trace(
      json::array({x_event("Forward 0", 0, 10), x_event("c10d::send", 5, 1, "cpu_op"),
                   x_event("c10d::recv_", 20, 10, "cpu_op"), x_event("gloo:recv", 25, 5, "cpu_op"),
                   x_event("Backward 0", 30, 20)}),
      "rank-1.json", 1);
  EXPECT_EQ(names(t.events), (std::vector<std::string>{"Forward 0:forward", "c10d::recv_:recv", "Backward 0:backward"}));
}

TEST(TorchTrace, AJsonListOfOtherThingsIsNoTrace) {
  EXPECT_FALSE(is_torch_trace(json::parse("[1, 2, 3]")));
  EXPECT_FALSE(is_torch_trace(json::array()));
  EXPECT_TRUE(is_torch_trace(json::array({x_event("PP:0F0", 0, 1)})));
}

TEST(TorchTrace, GpipeLabelsAreTheRanksOwnStage) {
  const RankTrace t = read_torch_trace(json::array({x_event("Forward 3", 0, 1), x_event("Backward 3", 2, 2)}),
                                       "rank-2.json.gz", 2);
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.events[0].action, parse_action("2F3"));
  EXPECT_EQ(t.events[1].action, parse_action("2B3"));
}

TEST(TorchTrace, NcclKernelsAreClassifiedByTheirCollectiveNameAndOnlyOutsideActionsCount) {
  json send = x_event("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", 100, 30, "kernel");
  send["args"] = {{"Collective name", "send"}};
  json recv = send;
  recv["ts"] = 200;
  recv["args"]["Collective name"] = "recv";
  json inside = send;  // under an action: overlapped with compute, costs nothing of its own
  inside["ts"] = 12;
  json reduce = x_event("ncclKernel_AllReduce_RING_LL_Sum_float", 300, 50, "kernel");
  reduce["args"] = {{"Collective name", "allreduce"}};
  const RankTrace t = read_torch_trace(kineto(0, {x_event("PP:0F0", 10, 40), send, recv, inside, reduce}), "t.json",
                                       std::nullopt);
  EXPECT_EQ(t.layout, "Kineto");
  std::vector<EventCategory> categories;
  for (const TraceEvent& e : t.events) categories.push_back(e.category);
  EXPECT_EQ(categories, (std::vector<EventCategory>{EventCategory::kForward, EventCategory::kSend, EventCategory::kRecv,
                                                    EventCategory::kAllreduce}));
}

TEST(TorchTrace, TheDevicesCopiesOfTheLabelsWinOverTheHosts) {
  const RankTrace t = read_torch_trace(
      kineto(0, {x_event("PP:0F0", 0, 5), x_event("PP:0F0", 3, 40, "gpu_user_annotation")}), "t.json", std::nullopt);
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_DOUBLE_EQ(t.events[0].duration_s, 40e-6);
}

TEST(TorchTrace, TimesAreAfterBaseTimeNanosecondsAndMemoryPeaksAreRead) {
  json memory = {{"ph", "i"}, {"name", "[memory]"}, {"ts", 5},
                 {"args", {{"Total Allocated", 3e9}, {"Device Id", 0}, {"Bytes", 1024}}}};
  json host = memory;
  host["args"]["Device Id"] = -1;
  host["args"]["Total Allocated"] = 9e9;  // the host's: not the device's peak
  json later = memory;
  later["args"]["Total Allocated"] = 5e9;
  const RankTrace t =
      read_torch_trace(kineto(0, {x_event("PP:0F0", 1000, 10), memory, host, later}, 2e12), "t.json", std::nullopt);
  EXPECT_DOUBLE_EQ(t.events[0].start_s, 2000 + 1e-3);
  ASSERT_TRUE(t.peak_memory_bytes);
  EXPECT_DOUBLE_EQ(*t.peak_memory_bytes, 5e9);
}

TEST(TorchTrace, AscendTimesAreStringsAndHcclEventsAreNamedByKind) {
  json step = x_event("ProfilerStep#1", 0, 0);
  step["ts"] = "1700000000000000.500";
  step["dur"] = "1000";
  json send = x_event("hcom_send__123_0_1", 0, 0, "HCCL");
  send["ts"] = "1700000000000100";
  send["dur"] = "20";
  json reduce = x_event("hcom_allReduce__456_1_1", 0, 0, "HCCL");
  reduce["ts"] = "1700000000000500";
  reduce["dur"] = "30";
  const RankTrace t = read_torch_trace(json::array({step, send, reduce}), "trace_view.json", 0);
  EXPECT_EQ(t.layout, "Ascend");
  EXPECT_EQ(names(t.events),
            (std::vector<std::string>{"hcom_send__123_0_1:send", "hcom_allReduce__456_1_1:allreduce"}));
  EXPECT_DOUBLE_EQ(t.steps.at(0).start_s, 1700000000.0000005);
}

TEST(TorchTrace, ThePipelineRankComesFromThePipelineGroup) {
  json trace = kineto(5, json::array({x_event("PP:1F0", 0, 1)}));
  trace["distributedInfo"]["pg_config"] = json::array(
      {{{"pg_name", "0"}, {"pg_desc", "default_pg"}, {"ranks", {0, 1, 2, 3, 4, 5, 6, 7}}},
       {{"pg_name", "3"}, {"pg_desc", "mesh_dp"}, {"ranks", {1, 5}}},
       {{"pg_name", "4"}, {"pg_desc", "mesh_pp"}, {"ranks", {4, 5, 6, 7}}}});
  const RankTrace t = read_torch_trace(trace, "t.json", 3);
  EXPECT_EQ(t.global_rank, 5);
  EXPECT_EQ(t.rank, 1);
  EXPECT_EQ(t.pipeline_group, (std::vector<int>{4, 5, 6, 7}));
}

TEST(TorchTrace, TheRankOfAFileName) {
  EXPECT_EQ(rank_in_file_name("rank3_trace.json"), 3);
  EXPECT_EQ(rank_in_file_name("rank-12.json.gz"), 12);
  EXPECT_EQ(rank_in_file_name("Rank_0.json"), 0);
  EXPECT_EQ(rank_in_file_name("host_123.1700000000.pt.trace.json"), std::nullopt);
  EXPECT_EQ(rank_in_file_name("ranking.json"), std::nullopt);
}

TEST(TorchTrace, ATraceWithoutARankSaysHowToNameIt) {
  try {
    read_torch_trace(json::array({x_event("PP:0F0", 0, 1)}), "host_1.pt.trace.json", std::nullopt);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("rank{R}_trace.json"), std::string::npos) << error.what();
  }
}

TEST(TorchTrace, AMalformedEventIsNamedByItsIndex) {
  json bad = x_event("PP:0F0", 0, 1);
  bad["ts"] = "soon";
  try {
    read_torch_trace(json::array({x_event("a", 0, 1), bad}), "r.json", 0);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("r.json: event 1: ts \"soon\""), std::string::npos) << error.what();
  }
}

RankTrace rank_trace(int rank, std::vector<TraceEvent> events, std::vector<ProfilerStep> steps,
                     std::string layout = "legacy profiler") {
  RankTrace t;
  t.source = "rank" + std::to_string(rank);
  t.layout = std::move(layout);
  t.rank = rank;
  for (TraceEvent& e : events) e.rank = RankId(rank);
  t.events = std::move(events);
  t.steps = std::move(steps);
  return t;
}

TraceEvent action_event(const std::string& action, double start, double duration) {
  const Action a = parse_action(action);
  return {RankId(0), "PP:" + action, category_of(a.kind), a, start, duration};
}

// Two ranks, each on its own clock: rank 1's reads 100 s more than rank 0's.
// Truth on rank 0's clock: 0F0 [0, 1), transfer [1, 1.1), 1F0 [1.1, 2.1),
// 1B0 [2.1, 4.1), transfer [4.1, 4.2), 0B0 [4.2, 6.2).
std::vector<RankTrace> two_clocks(const std::string& layout = "legacy profiler") {
  return {rank_trace(0,
                     {action_event("0F0", 0, 1), action_event("0SEND_F0", 1, 0.01), action_event("0RECV_B0", 1.01, 3.19),
                      action_event("0B0", 4.2, 2)},
                     {{7, -0.5, 7}}, layout),
          rank_trace(1,
                     {action_event("1RECV_F0", 100.5, 0.6), action_event("1F0", 101.1, 1),
                      action_event("1B0", 102.1, 2), action_event("1SEND_B0", 104.1, 0.01)},
                     {{7, 100.4, 107}}, layout)};
}

TEST(MergeRankTraces, ClocksAreAlignedOnTheMiddleOfWhatTheMessagesAllow) {
  const MergedTrace m = merge_rank_traces(two_clocks(), std::nullopt);
  // F: rank 1's offset >= 1 - 101.1 = -100.1; B: <= 4.2 - 104.1 = -99.9.
  ASSERT_EQ(m.clock_offset_s.size(), 2u);
  EXPECT_NEAR(m.clock_offset_s[1], -100.0, 1e-9);
  EXPECT_NEAR(m.clock_window_s[1].first, -100.1, 1e-9);
  EXPECT_NEAR(m.clock_window_s[1].second, -99.9, 1e-9);
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.timeline.num_ranks, 2);
  EXPECT_DOUBLE_EQ(m.timeline.start_s(), 0);
  EXPECT_NEAR(m.timeline.makespan_s(), 6.2, 1e-9);
}

TEST(MergeRankTraces, AReceivePostedBeforeItsSendWaitsUntilTheSendStarts) {
  const MergedTrace m = merge_rank_traces(two_clocks(), std::nullopt);
  // 1RECV_F0 from 0.5 to 1.1 on rank 0's clock, its send at 1.0: a wait of 0.5, then 0.1 of receiving.
  std::vector<const TraceEvent*> recv;
  for (const TraceEvent& e : m.timeline.events) {
    if (e.action == parse_action("1RECV_F0")) recv.push_back(&e);
  }
  ASSERT_EQ(recv.size(), 2u);
  EXPECT_EQ(recv[0]->category, EventCategory::kWait);
  EXPECT_NEAR(recv[0]->duration_s, 0.5, 1e-9);
  EXPECT_EQ(recv[1]->category, EventCategory::kRecv);
  EXPECT_NEAR(recv[1]->duration_s, 0.1, 1e-9);
}

TEST(MergeRankTraces, OneWallClockThatEveryMessageAgreesWithIsNotShifted) {
  std::vector<RankTrace> ranks = two_clocks("Kineto");
  for (TraceEvent& e : ranks[1].events) e.start_s -= 100.05;  // within the window: a plausible shared clock
  ranks[1].steps[0] = {7, 0.3, 7};
  const MergedTrace m = merge_rank_traces(std::move(ranks), std::nullopt);
  EXPECT_EQ(m.clock_offset_s[1], 0.0);
}

TEST(MergeRankTraces, StepsAreCutAndTheLastCommonOneIsTheDefault) {
  std::vector<RankTrace> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(rank_trace(r,
                               {action_event(fmt::format("{}F0", r), 0.1 + r, 0.5),
                                action_event(fmt::format("{}F0", r), 10.1 + r, 0.7),
                                action_event(fmt::format("{}F0", r), 20.1 + r, 0.9)},
                               {{0, 0, 10}, {1, 10, 20}, {2, 20, 30}}, "Kineto"));
  }
  ranks[1].steps.pop_back();  // rank 1 has steps 0 and 1 only
  const MergedTrace last = merge_rank_traces(ranks, std::nullopt);
  EXPECT_EQ(last.step, 1);
  EXPECT_EQ(last.steps, (std::vector<int>{0, 1}));
  ASSERT_EQ(last.step_spans_s.size(), 2u);
  EXPECT_NEAR(last.step_spans_s[1], 1.7, 1e-9);  // 0F0 at 10.1, 1F0 ends 11.8: one clock, F after F, no shift
  const MergedTrace first = merge_rank_traces(ranks, 0);
  EXPECT_EQ(first.step, 0);
  EXPECT_EQ(first.timeline.events.size(), 2u);
  try {
    merge_rank_traces(ranks, 2);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("--step 2: not a step of every rank's trace; the steps are 0, 1"),
              std::string::npos)
        << error.what();
  }
}

TEST(MergeRankTraces, AMissingOrRepeatedRankIsAnError) {
  std::vector<RankTrace> ranks = two_clocks();
  ranks[1].rank = 2;
  EXPECT_THROW(merge_rank_traces(ranks, std::nullopt), Error);
  ranks[1].rank = 0;
  try {
    merge_rank_traces(ranks, std::nullopt);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("are both pipeline rank 0"), std::string::npos) << error.what();
  }
}

TEST(MergeRankTraces, AFileReadAsTheWrongRankIsAnError) {
  std::vector<RankTrace> ranks = two_clocks();
  std::swap(ranks[0].rank, ranks[1].rank);  // the files named the other's rank
  try {
    merge_rank_traces(ranks, std::nullopt);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("is read as pipeline rank 0 of 2, but its PP:1RECV_F0 is stage 1's"),
              std::string::npos)
        << error.what();
  }
}

TEST(MergeRankTraces, OfSeveralPipelinesTheOneOfTheLowestRankIsRead) {
  std::vector<RankTrace> ranks = two_clocks();
  std::vector<RankTrace> replica = two_clocks();
  ranks[0].pipeline_group = ranks[1].pipeline_group = {0, 2};
  replica[0].pipeline_group = replica[1].pipeline_group = {1, 3};
  ranks.insert(ranks.end(), replica.begin(), replica.end());
  const MergedTrace m = merge_rank_traces(std::move(ranks), std::nullopt);
  EXPECT_EQ(m.timeline.num_ranks, 2);
  ASSERT_FALSE(m.notes.empty());
  EXPECT_NE(m.notes.front().find("2 pipelines in the traces: read the one of global ranks 0,2"), std::string::npos)
      << m.notes.front();
}

}  // namespace
}  // namespace pipeflow
