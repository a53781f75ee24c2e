#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <regex>

#include "pipeflow/core/file.h"
#include "pipeflow/model/hardware.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

std::string source_path(const std::string& relative) { return std::string(PIPEFLOW_SOURCE_DIR) + "/" + relative; }

// nccl-tests' columns, sizes 1 KiB, 2 KiB, ... `max_bytes`, no wrong element,
// algbw = bytes / time and busbw = algbw × `bus_factor`.
void expect_rows(const nlohmann::json& rows, std::int64_t max_bytes, double bus_factor, const char* test) {
  ASSERT_TRUE(rows.is_array()) << test;
  std::int64_t bytes = 1024;
  for (const nlohmann::json& row : rows) {
    SCOPED_TRACE(::testing::Message() << test << " " << row.dump());
    ASSERT_EQ(row.size(), 5u);
    EXPECT_EQ(row.at("bytes").get<std::int64_t>(), bytes);
    const double time_us = row.at("time_us");
    const double algbw = row.at("algbw_GBps");
    EXPECT_GT(time_us, 0);
    EXPECT_NEAR(algbw, static_cast<double>(bytes) / (time_us * 1e-6) / 1e9, 1e-12 * algbw);
    EXPECT_NEAR(row.at("busbw_GBps").get<double>(), algbw * bus_factor, 1e-12 * algbw);
    EXPECT_EQ(row.at("wrong_elements").get<std::int64_t>(), 0);
    bytes *= 2;
  }
  EXPECT_EQ(bytes, 2 * max_bytes) << test;
}

TEST(CommbenchCommand, TwoProcessesGiveNcclTestsRowsAndAProfileThatSimulateReads) {
  const std::string dir = make_temp_dir();
  const std::string profile_path = dir + "/link.json";
  // Up to 16 MiB (some 3 ms one way here), so that a loaded machine's pause
  // in the 1 KiB rounds cannot make them slower than the largest message,
  // which --save-hardware refuses.
  const CommandResult r = run_mpirun(
      2, "commbench --json --max-bytes 16M --iters 3 --warmup 1 --save-hardware " + profile_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);  // rank 0 alone prints
  EXPECT_EQ(json.at("processes"), 2);
  EXPECT_EQ(json.at("hosts"), 1);
  EXPECT_EQ(json.at("iters"), 3);
  expect_rows(json.at("p2p"), 1 << 24, 1.0, "p2p");
  expect_rows(json.at("baseline"), 1 << 24, 1.0, "baseline");
  expect_rows(json.at("all_reduce"), 1 << 24, 2.0 * (2 - 1) / 2, "all_reduce");

  // The one link is within the machine: latency = the 1 KiB one-way time,
  // bandwidth = 1 MiB / (its time − latency); the inter-node figures stay cpu's.
  const HardwareProfile profile = load_hardware(profile_path);
  const HardwareProfile cpu = hardware_preset("cpu");
  const double first_s = json["p2p"].front().at("time_us").get<double>() * 1e-6;
  const double last_s = json["p2p"].back().at("time_us").get<double>() * 1e-6;
  EXPECT_EQ(profile.name, "cpu-commbench");
  EXPECT_NEAR(profile.intra_node_latency_s, first_s, 1e-12 * first_s);
  EXPECT_NEAR(profile.intra_node_bandwidth_bytes_per_s, (1 << 24) / (last_s - first_s),
              1e-9 * profile.intra_node_bandwidth_bytes_per_s);
  EXPECT_EQ(profile.inter_node_latency_s, cpu.inter_node_latency_s);
  EXPECT_EQ(profile.inter_node_bandwidth_bytes_per_s, cpu.inter_node_bandwidth_bytes_per_s);
  EXPECT_EQ(profile.peak_flop_per_s, cpu.peak_flop_per_s);
  EXPECT_NE(profile.note.find("measured by pipeflow commbench (2 processes on 1 host"), std::string::npos)
      << profile.note;

  const CommandResult simulated = run_pipeflow(
      "simulate --config " + source_path("examples/simulate/gpt-tiny-1f1b-cpu.json") + " --hardware " + profile_path);
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_NE(simulated.out.find("cpu-commbench"), std::string::npos) << simulated.out;
}

TEST(CommbenchCommand, ThreeProcessesMeasureBothLinksAndTheAllReduceBusFactor) {
  const CommandResult r = run_mpirun(3, "commbench --json --max-bytes 16K --iters 2 --warmup 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json.at("processes"), 3);
  expect_rows(json.at("p2p"), 16 << 10, 1.0, "p2p");
  expect_rows(json.at("baseline"), 16 << 10, 1.0, "baseline");
  expect_rows(json.at("all_reduce"), 16 << 10, 2.0 * (3 - 1) / 3, "all_reduce");
}

// The tensor-parallel test: 4 processes in groups of 2, each activation's
// all-reduce and all-gather through the layers' collectives, right answers,
// nccl-tests' bus factors; bad groups and activations named.
TEST(CommbenchCommand, TensorParallelGroupsMeasureALayersAllReduceAndAllGather) {
  const CommandResult r = run_mpirun(
      4, "commbench --json --max-bytes 1K --iters 2 --warmup 1 --tp 2 --activation 2,8,32 --activation 1,4,16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json.at("tensor_parallel"), 2);
  ASSERT_EQ(json.at("tensor").size(), 2u);
  EXPECT_EQ(json["tensor"][0]["activation"], nlohmann::json::parse("[2, 8, 32]"));
  for (const nlohmann::json& row : json.at("tensor")) {
    const std::int64_t floats = row["activation"][0].get<std::int64_t>() * row["activation"][1].get<std::int64_t>() *
                                row["activation"][2].get<std::int64_t>();
    for (const auto& [test, factor] : {std::pair{"all_reduce", 1.0}, std::pair{"all_gather", 0.5}}) {
      const nlohmann::json& m = row.at(test);
      EXPECT_EQ(m.at("bytes").get<std::int64_t>(), 4 * floats) << test;
      EXPECT_EQ(m.at("wrong_elements").get<std::int64_t>(), 0) << test;
      EXPECT_NEAR(m.at("busbw_GBps").get<double>(), factor * m.at("algbw_GBps").get<double>(),
                  1e-12 * m.at("algbw_GBps").get<double>())
          << test;
    }
  }
  const CommandResult odd = run_pipeflow("commbench --tp 2 --activation 1,1,3");
  EXPECT_EQ(odd.exit_code, 1);
  EXPECT_NE(odd.err.find("--activation 1,1,3: b, t and c must be positive"), std::string::npos) << odd.err;
  const CommandResult garbled = run_pipeflow("commbench --tp 2 --activation 8x64");
  EXPECT_EQ(garbled.exit_code, 1);
  EXPECT_NE(garbled.err.find("--activation 8x64: expected B,T,C"), std::string::npos) << garbled.err;
  const CommandResult three = run_mpirun(3, "commbench --max-bytes 1K --iters 1 --tp 2");
  EXPECT_NE(three.exit_code, 0);
  EXPECT_NE(three.err.find("--tp 2: mpirun started 3 processes, not a multiple of it"), std::string::npos) << three.err;
}

TEST(CommbenchCommand, TheTableNamesEveryTestAndTheRatioToRawMpi) {
  const CommandResult r = run_mpirun(2, "commbench --max-bytes 4K --iters 2 --warmup 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("pipeflow commbench: 2 processes on 1 host, 2 timed rounds per size after 0 warm-up", 0), 0u)
      << r.out;
  // Columns are as wide as their widest value: a slow round widens one.
  EXPECT_TRUE(std::regex_search(r.out, std::regex("size +p2p us +p2p GB/s +wrong +baseline us +baseline GB/s +wrong +"
                                                  "p2p/baseline +all-reduce us +algbw GB/s +busbw GB/s +wrong\n")))
      << r.out;
  EXPECT_NE(r.out.find("reduce-scatter then all-gather"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n1.00 KiB "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n4.00 KiB "), std::string::npos) << r.out;
}

TEST(CommbenchCommand, WithoutMpirunTheErrorGivesTheCommand) {
  const CommandResult r = run_pipeflow("commbench");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("start it with mpirun, e.g. mpirun -np 2 pipeflow commbench"), std::string::npos) << r.err;
}

TEST(CommbenchCommand, BadSizesAreErrorsNamingTheOption) {
  const CommandResult not_power = run_pipeflow("commbench --max-bytes 3M");
  EXPECT_EQ(not_power.exit_code, 1);
  EXPECT_NE(not_power.err.find("--max-bytes 3145728: must be a power of two"), std::string::npos) << not_power.err;
  const CommandResult unit = run_pipeflow("commbench --min-bytes 1X");
  EXPECT_EQ(unit.exit_code, 1);
  EXPECT_NE(unit.err.find("--min-bytes \"1X\": unknown unit"), std::string::npos) << unit.err;
  const CommandResult order = run_pipeflow("commbench --min-bytes 1M --max-bytes 1K");
  EXPECT_EQ(order.exit_code, 1);
  EXPECT_NE(order.err.find("--min-bytes 1048576 exceeds --max-bytes 1024"), std::string::npos) << order.err;
}

TEST(CommbenchCommand, OneProcessIsAnErrorGivingTheCommand) {
  const CommandResult r = run_mpirun(1, "commbench --max-bytes 4K");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("run mpirun -np 2 (or more) pipeflow commbench"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace pipeflow::testing
