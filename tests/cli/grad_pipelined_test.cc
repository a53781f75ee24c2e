// pipeflow grad --schedule: the reference batch through the pipeline runtime
// gives PyTorch's (and the unpipelined run's) loss and every gradient.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "../nn/test_support.h"
#include "pipeflow/core/file.h"
#include "pipeflow/nn/safetensors.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

const std::string kReference = std::string(PIPEFLOW_SOURCE_DIR) + "/tests/data/gpt2_reference.safetensors";

using nn::testing::relative_error;

void expect_reference_gradients(const std::string& layout, const std::string& described) {
  SCOPED_TRACE(layout);
  const std::string dir = make_temp_dir();
  const CommandResult result = run_pipeflow("grad --weights " + kReference + " --batch " + kReference + " --out " +
                                            dir + "/g.safetensors " + layout);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("over 4 sequences of 16 tokens, " + described + ")"), std::string::npos) << result.out;
  const auto reference = nn::SafetensorsFile::read(kReference);
  const auto grads = nn::SafetensorsFile::read(dir + "/g.safetensors");
  const double expected_loss = std::stod(reference.metadata("loss"));
  EXPECT_NEAR(std::stod(grads.metadata("loss")), expected_loss, 1e-5 * expected_loss);
  EXPECT_EQ(grads.names().size(), 28u);
  for (const std::string& name : grads.names()) {
    EXPECT_LT(relative_error(grads.floats(name).span(), reference.floats("grad." + name).span()), 1e-5) << name;
  }
}

TEST(GradCommand, ThroughThePipelineEverySchedulesGradientsAreTheReferences) {
  expect_reference_gradients("--schedule 1f1b --stages 2 --microbatches 2",
                             "1f1b on 2 ranks (2 stages), 2 micro-batches of 2");
  expect_reference_gradients("--schedule gpipe --stages 4 --microbatches 4 --partition uniform",
                             "gpipe on 4 ranks (4 stages), 4 micro-batches of 1");
  expect_reference_gradients("--schedule interleaved-1f1b --stages 2 --microbatches 2 --virtual 2",
                             "interleaved-1f1b on 2 ranks (4 stages), 2 micro-batches of 2");
  expect_reference_gradients("--schedule zbv --stages 2 --microbatches 4",
                             "zbv on 2 ranks (4 stages), 4 micro-batches of 1");
}

TEST(GradCommand, MicrobatchesMustCutTheBatchEvenly) {
  const std::string dir = make_temp_dir();
  const CommandResult result = run_pipeflow("grad --weights " + kReference + " --batch " + kReference + " --out " +
                                            dir + "/g.safetensors --schedule gpipe --stages 2 --microbatches 3");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err,
            "pipeflow: error: --microbatches 3 does not divide the batch of 4 sequences: micro-batches must be equal; "
            "use a divisor of 4\n");
  EXPECT_FALSE(std::filesystem::exists(dir + "/g.safetensors"));
  // Zero micro-batches is the schedule's rule, not a division by zero.
  const CommandResult zero = run_pipeflow("grad --weights " + kReference + " --batch " + kReference + " --out " +
                                          dir + "/g.safetensors --schedule gpipe --stages 2 --microbatches 0");
  EXPECT_EQ(zero.exit_code, 1);
  EXPECT_EQ(zero.err, "pipeflow: error: gpipe needs microbatches >= 1 (got 0)\n");
  const CommandResult no_schedule = run_pipeflow("grad --weights " + kReference + " --batch " + kReference +
                                                 " --out " + dir + "/g.safetensors --stages 2");
  EXPECT_EQ(no_schedule.err, "pipeflow: error: --stages lays out a pipeline: give --schedule too, or leave it out\n");
  EXPECT_EQ(run_pipeflow("grad --weights " + kReference + " --batch " + kReference + " --out " + dir +
                         "/g.safetensors --virtual 2")
                .err,
            "pipeflow: error: --virtual lays out a pipeline: give --schedule too, or leave it out\n");
  // A NaN in the weights: an error, and no gradients file.
  std::string bytes = read_file(kReference);
  std::uint64_t header = 0;
  std::memcpy(&header, bytes.data(), sizeof header);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto begin = nn::SafetensorsFile::parse(bytes, kReference).entry("wte.weight").begin;
  std::memcpy(bytes.data() + sizeof header + header + begin, &nan, sizeof nan);
  write_file_atomic(dir + "/nan.safetensors", bytes);
  const CommandResult not_finite = run_pipeflow("grad --weights " + dir + "/nan.safetensors --batch " + kReference +
                                                " --out " + dir + "/g.safetensors");
  EXPECT_EQ(not_finite.exit_code, 1);
  EXPECT_EQ(not_finite.err, "pipeflow: error: " + dir +
                                "/nan.safetensors: tensor wte.weight holds nan at index 0: values must be finite; "
                                "start from another file or an earlier checkpoint\n");
  EXPECT_FALSE(std::filesystem::exists(dir + "/g.safetensors"));
}

}  // namespace
}  // namespace pipeflow::testing
