#include <gtest/gtest.h>

#include <filesystem>

#include "../trace/xml_check.h"
#include "pipeflow/core/file.h"
#include "pipeflow/schedule/generators.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

TEST(ScheduleSvg, EveryScheduleWritesAWellFormedSvgFile) {
  const std::string dir = make_temp_dir();
  for (const ScheduleInfo& info : list_schedules()) {
    for (const char* lowered : {"", " --lowered"}) {
      SCOPED_TRACE(info.name + lowered);
      const std::string path = dir + "/" + info.name + ".svg";
      const CommandResult result =
          run_pipeflow(fmt::format("schedule --schedule {} --stages 4 --microbatches 8 --virtual {} --format svg{} -o {}",
                                   info.name, info.takes_virtual ? 2 : 1, lowered, path));
      ASSERT_EQ(result.exit_code, 0) << result.err;
      const std::string svg = read_file(path);
      EXPECT_EQ(xml_problem(svg), "");
      EXPECT_EQ(occurrences(svg, "<g class=\"rank\""), 4);
      EXPECT_NE(svg.find(info.name + ": 4 ranks, 8 micro-batches"), std::string::npos);
      EXPECT_NE(svg.find("time (unit)"), std::string::npos);
    }
  }
}

TEST(ScheduleSvg, TheTitleCountsInTheSingularForOne) {
  const CommandResult result = run_pipeflow("schedule --schedule gpipe --stages 1 --microbatches 1 --format svg");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find(">gpipe: 1 rank, 1 micro-batch, unit costs F=1 B=2 I=W=1 — bubble 0.0%</text>"),
            std::string::npos)
      << result.out;
}

}  // namespace
}  // namespace pipeflow::testing
