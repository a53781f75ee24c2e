#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../trace/xml_check.h"
#include "pipeflow/core/file.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

const std::string kSource = PIPEFLOW_SOURCE_DIR;

// The course's case study (docs/ANALYZE.md): 4 stages of 2 cards, GPipe, 16
// micro-batches, a slow link between stages, embedding and head counted as
// whole layers by the uniform partition.
std::string case_study_trace(const std::string& dir) {
  const std::string trace = dir + "/trace.json";
  const CommandResult r =
      run_pipeflow("simulate --config examples/analyze/case_study.json --trace " + trace, kSource);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return trace;
}

TEST(AnalyzeCommand, TheCaseStudyGivesTheCoursesThreeFixesRankedByGain) {
  const std::string dir = make_temp_dir();
  const CommandResult r = run_pipeflow("analyze " + case_study_trace(dir) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  EXPECT_GT(json["bubble"].get<double>(), 0.3);  // about the course's 65% device utilisation
  EXPECT_LT(json["bubble"].get<double>(), 0.4);
  EXPECT_GT(json["comm_wait_share"].get<double>(), 0.2);
  std::vector<std::string> kinds;
  for (const auto& advice : json["advice"]) kinds.push_back(advice["kind"]);
  EXPECT_EQ(kinds, (std::vector<std::string>{"overlap", "microbatches", "partition"}));
  EXPECT_NE(json["advice"][1]["change"].get<std::string>().find("\"1f1b\""), std::string::npos);
  // Stage 0 takes a block from stage 1, and the head's stage gives one up the line too.
  const auto& moves = json["advice"][2]["details"];
  ASSERT_FALSE(moves.empty());
  EXPECT_EQ(moves[0], "stage 1: block.8..block.16 -> block.8..block.15");
}

TEST(AnalyzeCommand, ARunDirectoryOfTrainIsAnalysedFromItsTraceWithMeasuredCosts) {
  const std::string dir = make_temp_dir();
  const CommandResult train = run_pipeflow(
      "train --config examples/train_1f1b_2stage_small.json --steps 3 --out-dir " + dir + " --partition uniform",
      kSource);
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const nlohmann::json config = nlohmann::json::parse(read_file(dir + "/run_config.json"));
  EXPECT_TRUE(config.contains("model"));
  const CommandResult r = run_pipeflow("analyze " + dir + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["ranks"].size(), 2u);
  EXPECT_TRUE(json.contains("resimulated"));
  EXPECT_EQ(json["source"], dir + "/trace.json");
}

// Renders `html` in headless Chromium and returns the DOM it built.
std::string rendered_dom(const std::string& html_path) {
  const std::string out = html_path + ".dom";
  const std::string command = fmt::format(
      "chromium-headless-shell --no-sandbox --headless --disable-gpu --dump-dom 'file://{}' >'{}' 2>/dev/null", html_path,
      out);
  const int status = std::system(command.c_str());
  if (status != 0) {
    ADD_FAILURE() << "chromium-headless-shell failed (" << status
                  << "): install the Debian package chromium-headless-shell (make test does)";
    return "";
  }
  return read_file(out);
}

TEST(AnalyzeCommand, TheHtmlReportRendersInChromiumWithTheTimelineAndTheNumbersOfTheJson) {
  const std::string dir = make_temp_dir();
  const std::string trace = case_study_trace(dir);
  const std::string html = dir + "/report.html";
  const CommandResult r = run_pipeflow("analyze " + trace + " --json --html " + html);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  const std::string page = read_file(html);
  const std::size_t svg_start = page.find("<svg");
  ASSERT_NE(svg_start, std::string::npos);
  const std::size_t svg_end = page.find("</svg>", svg_start);
  EXPECT_EQ(XmlCheck(page.substr(svg_start, svg_end + 6 - svg_start)).run(), "");

  const std::string dom = rendered_dom(html);
  ASSERT_FALSE(dom.empty());
  // The timeline: one row per rank, and a box per compute action (GPipe: 2 per micro-batch and stage).
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(dom.find(fmt::format("data-rank=\"{}\"", rank)), std::string::npos) << rank;
  }
  std::size_t boxes = 0;
  for (std::size_t at = dom.find("data-action="); at != std::string::npos; at = dom.find("data-action=", at + 1)) {
    ++boxes;
  }
  EXPECT_EQ(boxes, 2u * 16 * 4);
  // The advice table: the JSON's gains, in its order.
  std::size_t cursor = dom.find("<table id=\"advice\">");
  ASSERT_NE(cursor, std::string::npos);
  for (const auto& advice : json["advice"]) {
    const std::string gain = fmt::format("<td>{:+.1f}%</td>", 100 * advice["gain"].get<double>());
    cursor = dom.find(gain, cursor);
    EXPECT_NE(cursor, std::string::npos) << gain;
  }
  EXPECT_NE(dom.find(fmt::format("bubble {:.1f}%", 100 * json["bubble"].get<double>())), std::string::npos);
}

TEST(AnalyzeCommand, PyTorchTracesInAFolderAreReadMergedAndAdvisedWithTheRunsConfiguration) {
  const CommandResult r = run_pipeflow(
      "analyze tests/data/traces/torch-1f1b --config tests/data/traces/torch-pipeline.json --json", kSource);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["reading"]["format"], "PyTorch profiler (legacy profiler)");
  EXPECT_EQ(json["reading"]["step"], 2);
  EXPECT_EQ(json["ranks"].size(), 2u);
  ASSERT_FALSE(json["advice"].empty());
  EXPECT_EQ(json["advice"][0]["kind"], "partition");
}

// torch_npu's step_trace_time.csv of 8 devices (tools/make_ascend_traces.py): one job, its bubble the Bubble
// column's, and the report says so.
TEST(AnalyzeCommand, AscendsDevicesStepTracesInAFolderAreOneJobWhoseBubbleIsTheBubbleColumns) {
  const std::string args = "analyze tests/data/logs/ascend --config tests/data/logs/ascend-run.json";
  const CommandResult text = run_pipeflow(args, kSource);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("step 439 ms on 4 ranks; bubble 37.4% (Ascend's Bubble column: receive time / (ranks x "
                          "step))"),
            std::string::npos)
      << text.out;
  // The profiler_info_{R}.json beside each are read for the ranks, not skipped as no trace.
  EXPECT_EQ(text.out.find("skipped"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("8 devices' step traces, their ranks from profiler_info_{R}.json"), std::string::npos);
  const nlohmann::json json = nlohmann::json::parse(run_pipeflow(args + " --json", kSource).out);
  EXPECT_EQ(json["reading"]["format"], "Ascend step trace (8 devices)");
  EXPECT_EQ(json["bubble_source"], "Ascend's Bubble column: receive time / (ranks x step)");
  const nlohmann::json truth = nlohmann::json::parse(read_file(kSource + "/tests/data/logs/ascend-truth.json"));
  EXPECT_NEAR(json["bubble"].get<double>(), truth["bubble"].get<double>(), 0.02);

  // Beside the devices' timelines (trace_view.json and the like), the CSVs are left out: the timelines say more.
  const std::string dir = make_temp_dir();
  std::filesystem::copy(kSource + "/tests/data/traces/torch-1f1b", dir + "/job");
  std::filesystem::copy(kSource + "/tests/data/logs/ascend/node0_4000_20261204100000000_ascend_pt",
                        dir + "/job/node0_ascend_pt", std::filesystem::copy_options::recursive);
  const CommandResult both = run_pipeflow("analyze job --json", dir);
  ASSERT_EQ(both.exit_code, 0) << both.err;
  const nlohmann::json merged = nlohmann::json::parse(both.out);
  EXPECT_EQ(merged["reading"]["format"], "PyTorch profiler (legacy profiler)");
  EXPECT_NE(merged.dump().find("their step_trace_time.csv left out"), std::string::npos) << both.out;
}

TEST(AnalyzeCommand, CompareSetsTwoRunsSideBySide) {
  const CommandResult r =
      run_pipeflow("analyze --compare tests/data/traces/torch-gpipe tests/data/traces/torch-1f1b --json", kSource);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  const nlohmann::json& bubble = json["figures"][1];
  EXPECT_EQ(bubble["figure"], "bubble");
  const nlohmann::json gpipe = nlohmann::json::parse(
      run_pipeflow("analyze tests/data/traces/torch-gpipe --json", kSource).out);
  EXPECT_DOUBLE_EQ(bubble["a"].get<double>(), gpipe["bubble"].get<double>());
  const CommandResult text =
      run_pipeflow("analyze --compare tests/data/logs/megatron.log tests/data/logs/megatron.log", kSource);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("+0.0 points"), std::string::npos) << text.out;
  const CommandResult one = run_pipeflow("analyze --compare tests/data/logs/megatron.log", kSource);
  EXPECT_NE(one.exit_code, 0);
  EXPECT_NE(one.err.find("--compare takes two runs"), std::string::npos) << one.err;
}

TEST(SweepCommand, PrintsTheTableAndWritesPlotsWhosePointsAreTheJsons) {
  const std::string dir = make_temp_dir();
  const std::string args =
      "sweep --model gpt2-124m --hardware a100-80g --stages 4 --global-batch 32 --seq 1024 "
      "--vary microbatches=4,8,16 --svg " + dir + "/sweep.svg";
  const CommandResult table = run_pipeflow(args);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_EQ(table.out.rfind("microbatches  step time  bubble  peak memory  tokens/s\n", 0), 0u) << table.out;
  const CommandResult r = run_pipeflow(args + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  const std::string svg = read_file(dir + "/sweep.svg");
  EXPECT_EQ(XmlCheck(svg).run(), "");
  const std::size_t bubbles = svg.find("data-metric=\"bubble_ratio\"");
  ASSERT_NE(bubbles, std::string::npos);
  std::size_t at = bubbles;
  for (const auto& point : json["points"]) {
    at = svg.find("data-value=\"", at) + 12;
    EXPECT_EQ(std::stod(svg.substr(at, svg.find('"', at) - at)), point["bubble_ratio"].get<double>());
  }
  EXPECT_EQ(run_pipeflow("sweep --vary speed=1").exit_code, 1);
}

}  // namespace
}  // namespace pipeflow::testing
