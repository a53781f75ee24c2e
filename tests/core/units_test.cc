#include "pipeflow/core/units.h"

#include <gtest/gtest.h>

#include "pipeflow/core/error.h"
#include "pipeflow/core/table.h"

namespace pipeflow {
namespace {

TEST(Units, Bytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(80.0 * kGiB), "80.0 GiB");
}

TEST(Units, Seconds) {
  EXPECT_EQ(format_seconds(0.0123), "12.3 ms");
  EXPECT_EQ(format_seconds(850e-6), "850 us");
  EXPECT_EQ(format_seconds(4.0), "4.00 s");
}

TEST(Units, SiAndPercent) {
  EXPECT_EQ(format_si(1.23e12, "FLOP/s"), "1.23 TFLOP/s");
  EXPECT_EQ(format_percent(3.0 / 19.0), "15.8%");
}

TEST(Units, CountsInTheSingularForOne) {
  EXPECT_EQ(format_count(1, "rank"), "1 rank");
  EXPECT_EQ(format_count(0, "rank"), "0 ranks");
  EXPECT_EQ(format_count(4, "micro-batch", "micro-batches"), "4 micro-batches");
  EXPECT_EQ(format_count(1, "micro-batch", "micro-batches"), "1 micro-batch");
}

TEST(Units, ByteSizesInPowersOf1024) {
  EXPECT_EQ(parse_byte_size("4096", "--min-bytes"), 4096);
  EXPECT_EQ(parse_byte_size("1K", "--min-bytes"), 1024);
  EXPECT_EQ(parse_byte_size("64M", "--max-bytes"), 64 << 20);
  EXPECT_EQ(parse_byte_size("2GiB", "--max-bytes"), std::int64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("8kb", "--max-bytes"), 8192);
  EXPECT_EQ(parse_byte_size("16B", "--max-bytes"), 16);
}

TEST(Units, ByteSizeErrorsNameTheOptionAndTheValue) {
  for (const char* text : {"", "K", "1T", "1Kx", "-1", "1.5M", "99999999999999999999", "8G9"}) {
    try {
      parse_byte_size(text, "--max-bytes");
      ADD_FAILURE() << text;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("--max-bytes \"" + std::string(text) + "\""), std::string::npos)
          << error.what();
    }
  }
  EXPECT_EQ(parse_byte_size("4294967296G", "--max-bytes"), std::int64_t{1} << 62);
  EXPECT_THROW(parse_byte_size("4294967297G", "--max-bytes"), Error);
}

TEST(TextTable, AlignsNumericColumnsRight) {
  TextTable table({"rank", "busy"});
  table.add_row({"0", "12.5"});
  table.add_row({"10", "3"});
  EXPECT_EQ(table.render(), "rank  busy\n----  ----\n   0  12.5\n  10     3\n");
}

}  // namespace
}  // namespace pipeflow
