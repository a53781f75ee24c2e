#include "pipeflow/trace/svg.h"

#include <gtest/gtest.h>

#include "pipeflow/core/error.h"
#include "pipeflow/core/units.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/passes.h"
#include "xml_check.h"

namespace pipeflow {
namespace {

int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

std::size_t compute_actions(const Schedule& schedule) {
  std::size_t n = 0;
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    for (const Action& a : schedule.actions(RankId(r))) n += is_compute(a.kind) ? 1 : 0;
  }
  return n;
}

TEST(Svg, EveryScheduleRendersAWellFormedTimelineWithARowPerRankAndABoxPerComputeAction) {
  for (const ScheduleInfo& info : list_schedules()) {
    for (bool lowered : {false, true}) {
      SCOPED_TRACE(info.name + (lowered ? " lowered" : ""));
      Schedule schedule = make_schedule(info.name, 3, 6, info.takes_virtual ? 2 : 1);
      if (lowered) schedule = insert_send_recv(schedule);
      const Execution execution = dry_run(schedule);
      const std::string svg = render_svg(timeline_from_execution(schedule, execution, info.name));
      EXPECT_EQ(testing::xml_problem(svg), "");
      EXPECT_EQ(svg.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"", 0),
                0u);
      EXPECT_EQ(occurrences(svg, "<g class=\"rank\""), 3);
      EXPECT_EQ(static_cast<std::size_t>(occurrences(svg, " data-action=\"")), compute_actions(schedule));
      EXPECT_NE(svg.find(info.name + " — bubble " + format_percent(bubble_fraction(execution)) + "</text>"),
                std::string::npos);
      EXPECT_NE(svg.find("<g class=\"legend\">"), std::string::npos);
      EXPECT_NE(svg.find(">F forward</text>"), std::string::npos);
      EXPECT_NE(svg.find(">idle</text>"), std::string::npos);
      EXPECT_EQ(occurrences(svg, "<rect class=\"idle\""), 3);  // each row's background
      EXPECT_NE(svg.find("<g class=\"axis\">"), std::string::npos);
    }
  }
}

TEST(Svg, LaterChunksAreLighterAndMicrobatchNumbersShowWhenTheyFit) {
  const Schedule schedule = make_interleaved_1f1b(2, 2, 2);
  const std::string svg = render_svg(timeline_from_execution(schedule, dry_run(schedule), "i"));
  // Stage 0 (chunk 0) in the forward blue, stage 2 (chunk 1) mixed 55% with white.
  EXPECT_NE(svg.find("data-action=\"0F0\" x=\"70.00\" y=\"49.00\" width=\"42.67\" height=\"24.00\" fill=\"#4e79a7\""),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find("data-action=\"2F0\""), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#afc3d7\""), std::string::npos);
  EXPECT_NE(svg.find("later chunk (lighter)"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#ffffff\">0</text>"), std::string::npos);
}

// A box narrower than 3 px gets no white outline, which would cover most of
// it: a 1000-micro-batch step drew every box in pastel.
TEST(Svg, NarrowBoxesHaveNoOutline) {
  const Schedule few = make_1f1b(2, 2);
  EXPECT_EQ(occurrences(render_svg(timeline_from_execution(few, dry_run(few), "few")), "stroke=\"#ffffff\""), 8);
  const Schedule many = make_1f1b(2, 1000);
  const std::string svg = render_svg(timeline_from_execution(many, dry_run(many), "many"));
  EXPECT_EQ(occurrences(svg, " data-action=\""), 4000);
  EXPECT_EQ(occurrences(svg, "stroke=\"#ffffff\""), 0);
}

TEST(Svg, WaitsAreHatchedAndTextIsEscaped) {
  Timeline timeline;
  timeline.title = "a <b> & \"c\"";
  timeline.num_ranks = 1;
  timeline.events.push_back({RankId(0), "0RECV_F0", EventCategory::kWait, std::nullopt, 0, 1});
  timeline.events.push_back({RankId(0), "0F0", EventCategory::kForward,
                             Action{StageId(0), ActionKind::kForward, MicrobatchId(0)}, 1, 1});
  const std::string svg = render_svg(timeline);
  EXPECT_EQ(testing::xml_problem(svg), "");
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; &quot;c&quot; — bubble 50.0%"), std::string::npos);
  EXPECT_NE(svg.find("class=\"wait\" x=\"70.00\" y=\"49.00\" width=\"320.00\" height=\"24.00\" fill=\"url(#hatch)\""),
            std::string::npos)
      << svg;
}

TEST(Svg, ALegendWiderThanTheCanvasWrapsOntoAnotherRow) {
  // One rank, one event of each category: ten legend entries, about 793 px,
  // on an 800 px canvas whose legend starts at x = 70.
  Timeline timeline;
  timeline.title = "all";
  timeline.num_ranks = 1;
  const EventCategory categories[] = {EventCategory::kForward,   EventCategory::kBackward,
                                      EventCategory::kBackwardInput, EventCategory::kBackwardWeight,
                                      EventCategory::kSend,      EventCategory::kWait,
                                      EventCategory::kAllreduce, EventCategory::kOptimizer,
                                      EventCategory::kOther};
  double at = 0;
  for (const EventCategory category : categories) {
    timeline.events.push_back({RankId(0), std::string(to_string(category)), category, std::nullopt, at, 1});
    at += 1;
  }
  const std::string svg = render_svg(timeline);
  EXPECT_EQ(testing::xml_problem(svg), "");
  EXPECT_NE(svg.find("width=\"800.00\" height=\"172.00\""), std::string::npos) << svg;
  // The first row ends with "optimizer"; "other" and "idle" start the second, 18 px lower.
  EXPECT_NE(svg.find("<text x=\"689.50\" y=\"138.00\">optimizer</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<rect x=\"70.00\" y=\"146.00\" width=\"12\" height=\"12\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("<text x=\"86.00\" y=\"156.00\">other</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<text x=\"142.50\" y=\"156.00\">idle</text>"), std::string::npos) << svg;
}

TEST(XmlCheck, RejectsWhatABrowserWouldReject) {
  EXPECT_EQ(testing::xml_problem("<a><b></a>"), "</a> closes <b> at offset 9");
  EXPECT_EQ(testing::xml_problem("<a x=1/>"), "unquoted attribute x at offset 5");
  EXPECT_EQ(testing::xml_problem("<a>&nope;</a>"), "unknown entity &nope; at offset 3");
  EXPECT_EQ(testing::xml_problem("<a x=\"1\" x=\"2\"/>"), "duplicate attribute x at offset 10");
  EXPECT_EQ(testing::xml_problem("<a/><b/>"), "a second root element at offset 4");
  EXPECT_EQ(testing::xml_problem("<?xml version=\"1.0\"?>\n<a><!-- c --><b x=\"&amp;\"/>t&#38;</a>\n"), "");
  EXPECT_EQ(testing::xml_problem("<a>\x01</a>"), "character U+0001, which XML 1.0 cannot hold at offset 3");
  EXPECT_EQ(testing::xml_problem("<a>&#x1b;</a>"), "&#x1b; refers to a character XML 1.0 cannot hold at offset 3");
  EXPECT_EQ(testing::xml_problem("<a>\xff</a>"), "a byte that is not UTF-8 at offset 3");
  EXPECT_EQ(testing::xml_problem("<a>\xc0\xaf</a>"), "an overlong UTF-8 form at offset 3");
  EXPECT_EQ(testing::xml_problem("<a>\t\xc3\xa9\xef\xbf\xbd</a>"), "");
}

// A schedule's name and an event's are a user's bytes: a control character
// (\x01, an escape sequence's \x1b) or a byte that is not UTF-8 made the SVG
// ill-formed; each is drawn as U+FFFD.
TEST(Svg, TextXmlCannotHoldIsReplaced) {
  Timeline timeline;
  timeline.title = "a\x01" "b\x1b[31mc\xff d\xef\xbf\xbf\t\xc3\xa9";
  timeline.num_ranks = 1;
  timeline.events.push_back({RankId(0), std::string("0F0\x02"), EventCategory::kForward,
                             Action{StageId(0), ActionKind::kForward, MicrobatchId(0)}, 0, 1});
  const std::string svg = render_svg(timeline);
  EXPECT_EQ(testing::xml_problem(svg), "");
  EXPECT_NE(svg.find("a\uFFFDb\uFFFD[31mc\uFFFD d\uFFFD\t\u00e9 — bubble"), std::string::npos) << svg;
  EXPECT_NE(svg.find("data-action=\"0F0\uFFFD\""), std::string::npos) << svg;
  EXPECT_EQ(xml_escape("<\x7f\r\n>"), "&lt;\x7f\r\n&gt;");
}

TEST(Svg, ATimelineTooLargeToDrawIsRefusedNamingTheFix) {
  EXPECT_NO_THROW(check_svg_events(kMaxSvgEvents, "the fix"));
  try {
    check_svg_events(kMaxSvgEvents + 1, "use fewer stages");
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "an SVG timeline of 200001 events is more than the limit of 200000 (about 60 MB, more than a browser "
                 "draws): use fewer stages");
  }
}

}  // namespace
}  // namespace pipeflow
