#include "pipeflow/runtime/commbench.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"

namespace pipeflow::runtime {
namespace {

TEST(Commbench, RowsFollowNcclTestsDefinitions) {
  const CommRow row = comm_row(1 << 20, 2e-4, all_reduce_bus_factor(4), 3);
  EXPECT_DOUBLE_EQ(row.algbw_bytes_per_s, 1048576 / 2e-4);
  EXPECT_DOUBLE_EQ(row.busbw_bytes_per_s, 1048576 / 2e-4 * 1.5);  // 2(n − 1)/n at n = 4
  EXPECT_EQ(row.wrong_elements, 3);
  EXPECT_DOUBLE_EQ(all_reduce_bus_factor(2), 1.0);
  EXPECT_DOUBLE_EQ(all_reduce_bus_factor(8), 1.75);
}

CommbenchOptions sizes(std::int64_t min_bytes, std::int64_t max_bytes) {
  CommbenchOptions options;
  options.min_bytes = min_bytes;
  options.max_bytes = max_bytes;
  return options;
}

TEST(Commbench, SizesArePowersOfTwoFromMinToMax) {
  const std::vector<std::int64_t> all = message_sizes(sizes(1024, 64 << 20));
  ASSERT_EQ(all.size(), 17u);
  EXPECT_EQ(all.front(), 1024);
  EXPECT_EQ(all[1], 2048);
  EXPECT_EQ(all.back(), 64 << 20);
}

TEST(Commbench, OptionsOutsideTheRulesAreErrorsNamingTheOption) {
  const auto message = [](const CommbenchOptions& options) {
    try {
      validate_commbench_options(options);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(sizes(1000, 4096)).rfind("--min-bytes 1000: must be a power of two", 0), 0u);
  EXPECT_EQ(message(sizes(2, 4)).rfind("--min-bytes 2: must be a power of two from 4 bytes", 0), 0u);
  EXPECT_EQ(message(sizes(1024, std::int64_t{2} << 30)).rfind("--max-bytes 2147483648:", 0), 0u);
  EXPECT_EQ(message(sizes(4096, 1024)), "--min-bytes 4096 exceeds --max-bytes 1024: give min <= max");
  CommbenchOptions options;
  EXPECT_EQ(message(options), "no error");
  options.iters = 0;
  EXPECT_EQ(message(options), "--iters 0: must be 1 to 1000000 timed rounds");
  options.iters = 2147483647;  // warmup + iters overflowed: inf GB/s and exit 0
  EXPECT_EQ(message(options), "--iters 2147483647: must be 1 to 1000000 timed rounds");
  options.iters = 1;
  options.warmup = -1;
  EXPECT_EQ(message(options), "--warmup -1: must be 0 to 1000000");
  options.warmup = 0;
  options.timeout = std::chrono::duration<double>(0);
  EXPECT_EQ(message(options), "--timeout 0: must be > 0 seconds");
}

// Links 0-1 and 2-3 within machines, 1-2 across: sizes 1, 2, 4 KiB.
CommbenchResult three_links() {
  CommbenchResult result;
  result.processes = 4;
  result.hosts = 2;
  result.options = sizes(1024, 4096);
  result.links = {{.rank = 0, .intra_node = true, .one_way_s = {1e-6, 1.2e-6, 1.5e-6}},
                  {.rank = 1, .intra_node = false, .one_way_s = {5e-6, 6e-6, 8e-6}},
                  {.rank = 2, .intra_node = true, .one_way_s = {2e-6, 2.1e-6, 2.5e-6}}};
  return result;
}

TEST(Commbench, TheProfileTakesTheSlowestLinkOfEachKindThroughItsEnds) {
  const HardwareProfile h100 = hardware_preset("h100");
  const HardwareProfile p = with_measured_links(h100, three_links());
  EXPECT_EQ(p.name, "h100-commbench");
  // Within machines the slowest per size: 2, 2.1, 2.5 µs.
  EXPECT_DOUBLE_EQ(p.intra_node_latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(p.intra_node_bandwidth_bytes_per_s, 4096 / (2.5e-6 - 2e-6));
  EXPECT_DOUBLE_EQ(p.inter_node_latency_s, 5e-6);
  EXPECT_DOUBLE_EQ(p.inter_node_bandwidth_bytes_per_s, 4096 / (8e-6 - 5e-6));
  EXPECT_EQ(p.peak_flop_per_s, h100.peak_flop_per_s);
  EXPECT_EQ(p.devices_per_node, h100.devices_per_node);
  // the latencies were estimates, now measured; the compute and memory figures stay estimates
  EXPECT_EQ(p.estimated, (std::vector<std::string>{"efficiency", "matmul_half_size", "memory_efficiency",
                                                   "collective_efficiency"}));
  EXPECT_NE(p.note.find("h100 with links measured by pipeflow commbench (4 processes on 2 hosts, 1.00 KiB to "
                        "4.00 KiB"),
            std::string::npos)
      << p.note;
  // The profile file's reader takes it back.
  const HardwareProfile read = hardware_from_json(hardware_to_json(p), "p.json");
  EXPECT_EQ(read.inter_node_bandwidth_bytes_per_s, p.inter_node_bandwidth_bytes_per_s);
}

TEST(Commbench, AKindNotMeasuredKeepsTheBaseFigures) {
  CommbenchResult one_machine = three_links();
  one_machine.links.erase(one_machine.links.begin() + 1);
  const HardwareProfile h100 = hardware_preset("h100");
  const HardwareProfile p = with_measured_links(h100, one_machine);
  EXPECT_DOUBLE_EQ(p.intra_node_latency_s, 2e-6);
  EXPECT_EQ(p.inter_node_latency_s, h100.inter_node_latency_s);
  EXPECT_EQ(p.inter_node_bandwidth_bytes_per_s, h100.inter_node_bandwidth_bytes_per_s);
  EXPECT_EQ(p.estimated, (std::vector<std::string>{"inter_node_latency_s", "efficiency", "matmul_half_size",
                                                   "memory_efficiency", "collective_efficiency"}));
}

TEST(Commbench, AProfileNeedsTwoSizesAndALargestMessageThatTookLonger) {
  CommbenchResult one_size = three_links();
  one_size.options.max_bytes = 1024;
  EXPECT_THROW(with_measured_links(hardware_preset("cpu"), one_size), Error);
  CommbenchResult flat = three_links();
  flat.links[0].one_way_s = {3e-6, 3e-6, 3e-6};
  flat.links[2].one_way_s = {3e-6, 3e-6, 3e-6};
  try {
    with_measured_links(hardware_preset("cpu"), flat);
    ADD_FAILURE();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("the intra-node link moved 1.00 KiB in 3.00 us and 4.00 KiB in 3.00 us"),
              std::string::npos)
        << error.what();
  }
}

TEST(Commbench, JsonHasATableOfRowsPerTest) {
  CommbenchResult result = three_links();
  result.p2p = {comm_row(1024, 1e-6, 1, 0)};
  result.baseline = {comm_row(1024, 2e-6, 1, 1)};
  result.all_reduce = {comm_row(1024, 4e-6, all_reduce_bus_factor(4), 0)};
  const nlohmann::json json = nlohmann::json::parse(commbench_json(result));
  EXPECT_EQ(json.at("processes"), 4);
  EXPECT_DOUBLE_EQ(json.at("p2p")[0].at("time_us").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(json.at("p2p")[0].at("algbw_GBps").get<double>(), 1.024);
  EXPECT_EQ(json.at("baseline")[0].at("wrong_elements"), 1);
  EXPECT_DOUBLE_EQ(json.at("all_reduce")[0].at("busbw_GBps").get<double>(), 0.256 * 1.5);
}

}  // namespace
}  // namespace pipeflow::runtime
