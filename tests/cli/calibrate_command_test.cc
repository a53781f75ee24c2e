#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "pipeflow/model/hardware.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

TEST(CalibrateCommand, WritesAProfileTheSimulatorLoadsWithPositiveFigures) {
  const std::string dir = make_temp_dir();
  const CommandResult result = run_pipeflow("calibrate --seconds 0.05 --name here -o " + dir + "/here.json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("sgemm, one thread:"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("wrote " + dir + "/here.json"), std::string::npos) << result.err;
  const HardwareProfile profile = load_hardware(dir + "/here.json");
  EXPECT_EQ(profile.name, "here");
  EXPECT_GT(profile.peak_flop_per_s, 1e9);
  EXPECT_GT(profile.memory_bytes, 0);
  EXPECT_GT(profile.memory_bandwidth_bytes_per_s, 0);
  EXPECT_GT(profile.intra_node_latency_s, 0);
  EXPECT_LT(profile.intra_node_latency_s, 1e-2);
  EXPECT_GT(profile.efficiency, 0);
  EXPECT_LE(profile.efficiency, 1);
  EXPECT_EQ(profile.devices_per_node, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(profile.estimated, (std::vector<std::string>{"inter_node_bandwidth_bytes_per_s", "inter_node_latency_s"}));
  const CommandResult simulated = run_pipeflow("simulate --model gpt-tiny --hardware " + dir +
                                               "/here.json --pp 2 --global-batch 16 --micro-batch 2 --json");
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_NE(simulated.out.find("\"hardware\": \"here\""), std::string::npos) << simulated.out;
  std::filesystem::remove_all(dir);
}

TEST(CalibrateCommand, WithoutAFileItPrintsTheProfile) {
  const CommandResult result = run_pipeflow("calibrate --seconds 0.02");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(hardware_from_json(result.out, "stdout").name, "calibrated");
}

}  // namespace
}  // namespace pipeflow::testing
