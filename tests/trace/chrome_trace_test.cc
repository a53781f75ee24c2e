#include "pipeflow/trace/chrome_trace.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/passes.h"

namespace pipeflow {
namespace {

Timeline example() {
  const Schedule schedule = insert_send_recv(make_zb_h1(3, 4));
  ExecutionCosts costs = unit_costs(CommMode::kBlocking);
  costs.duration = [](const Action& a, RankId r) { return 1e-3 * (1 + static_cast<int>(a.kind)) + 1e-4 * r.value(); };
  costs.transfer = [](const Action&, RankId, RankId) { return 2.5e-5; };
  Timeline timeline = timeline_from_execution(schedule, execute(schedule, costs), "zb-h1 \"p=3\"");
  return timeline;
}

TEST(ChromeTrace, WriteThenReadGivesTheTimelineBack) {
  const Timeline timeline = example();
  const Timeline back = read_chrome_trace(write_chrome_trace(timeline), "t.json");
  EXPECT_EQ(back.title, timeline.title);
  EXPECT_EQ(back.num_ranks, 3);
  EXPECT_EQ(back.time_unit, "s");
  ASSERT_EQ(back.events.size(), timeline.events.size());
  for (std::size_t i = 0; i < back.events.size(); ++i) {
    const TraceEvent& a = timeline.events[i];
    const TraceEvent& b = back.events[i];
    EXPECT_EQ(b.rank, a.rank);
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.category, a.category);
    EXPECT_EQ(b.action, a.action);
    EXPECT_DOUBLE_EQ(b.start_s, a.start_s);
    EXPECT_DOUBLE_EQ(b.duration_s, a.duration_s);
  }
}

TEST(ChromeTrace, EventsAreCompleteEventsInMicrosecondsOnePerRankTrack) {
  const nlohmann::json trace = nlohmann::json::parse(write_chrome_trace(example()));
  const nlohmann::json& events = trace.at("traceEvents");
  EXPECT_EQ(events[0], nlohmann::json::parse(
                           R"({"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"zb-h1 \"p=3\""}})"));
  EXPECT_EQ(events[3], nlohmann::json::parse(R"({"name":"thread_name","ph":"M","pid":0,"tid":2,"args":{"name":"rank 2"}})"));
  const nlohmann::json& first = events[4];
  EXPECT_EQ(first.at("name"), "0F0");
  EXPECT_EQ(first.at("cat"), "forward");
  EXPECT_EQ(first.at("ph"), "X");
  EXPECT_EQ(first.at("pid"), 0);
  EXPECT_EQ(first.at("tid"), 0);
  EXPECT_DOUBLE_EQ(first.at("ts").get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(first.at("dur").get<double>(), 1000.0);
  EXPECT_EQ(first.at("args").at("action"), "0F0");
  EXPECT_EQ(trace.at("otherData").at("num_ranks"), 3);
}

// Found by fuzz/chrome_trace_fuzz: a value of the wrong type escaped as the
// JSON library's exception (an "internal error" for the user).
TEST(ChromeTrace, ValuesOfTheWrongTypeAndTooManyRanksAreErrorsNamingTheFile) {
  for (const char* text : {R"({"traceEvents": [], "otherData": {"title": 7}})", R"({"traceEvents": [3]})",
                           R"({"traceEvents": [{"ph": "X", "tid": 70000, "ts": 0, "name": "F"}]})"}) {
    try {
      read_chrome_trace(text, "odd.json");
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& error) {
      EXPECT_EQ(std::string(error.what()).rfind("odd.json: ", 0), 0u) << error.what();
    }
  }
}

TEST(ChromeTrace, ReadsForeignTracesAndNamesBadEvents) {
  const Timeline t = read_chrome_trace(
      R"({"traceEvents":[{"name":"x","ph":"B","pid":0,"tid":0,"ts":1},
                         {"name":"opt","cat":"optimizer","ph":"X","pid":7,"tid":4,"ts":10,"dur":5}]})",
      "foreign.json");
  EXPECT_EQ(t.num_ranks, 5);
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0], (TraceEvent{RankId(4), "opt", EventCategory::kOptimizer, std::nullopt, 1e-5, 5e-6}));
  try {
    read_chrome_trace(R"({"traceEvents":[{"name":"F","ph":"X","tid":0,"ts":1,"cat":"fwd"}]})", "bad.json");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()).rfind("bad.json: traceEvents[0]: unknown event category \"fwd\"", 0), 0u)
        << error.what();
  }
  try {
    read_chrome_trace(R"({"events":[]})", "bad.json");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "bad.json: a Chrome trace is an object with a \"traceEvents\" list");
  }
}

// A tid is a rank: a whole number in [0, 65535] (2147483647 overflowed
// rank + 1 and crashed analyze; 2^32 wrapped to rank 0; 1.5 was cut to 1);
// times are finite and durations >= 0 (a negative one gave a 366% bubble).
TEST(ChromeTrace, RanksTimesAndDurationsOutsideTheirRangesAreErrors) {
  const auto error_for = [](const std::string& event) {
    try {
      read_chrome_trace(R"({"traceEvents":[)" + event + "]}", "t.json");
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("(no error)");
  };
  for (const char* tid : {"2147483647", "4294967296", "1.5", "-1", "65536", "\"0\""}) {
    EXPECT_EQ(error_for(std::string(R"({"name":"F","ph":"X","tid":)") + tid + R"(,"ts":0,"dur":1})"),
              std::string("t.json: traceEvents[0]: tid ") + tid +
                  " is not a rank: a rank is a whole number in [0, 65535]");
  }
  EXPECT_EQ(error_for(R"({"name":"F","ph":"X","tid":0,"ts":0,"dur":-5})"),
            "t.json: traceEvents[0]: dur -5 is not a duration: give microseconds >= 0");
  EXPECT_EQ(read_chrome_trace(R"({"traceEvents":[{"name":"F","ph":"X","tid":65535,"ts":0,"dur":1}]})", "t.json")
                .num_ranks,
            65536);
}

}  // namespace
}  // namespace pipeflow

namespace pipeflow {
namespace {

// An action named by an event without "cat" counted as other (flush) time,
// so a trace of bare actions had a 100% bubble.
TEST(ChromeTrace, AnActionWithoutACategoryTakesItsKinds) {
  const Timeline t = read_chrome_trace(
      R"({"traceEvents":[{"name":"0F0","ph":"X","tid":0,"ts":0,"dur":1},{"name":"x","ph":"X","tid":0,"ts":1,"dur":1}]})",
      "t.json");
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.events[0].category, EventCategory::kForward);
  EXPECT_EQ(t.events[1].category, EventCategory::kOther);
}

}  // namespace
}  // namespace pipeflow
