#include "pipeflow/sim/layout.h"

#include <gtest/gtest.h>

#include <string>

#include "../support/error_of.h"

namespace pipeflow {
namespace {

using testing::error_of;

Layout layout_of_file(const std::string& json) {
  return layout_of(resolve(parse_run_config(Config::parse(json, "run.json"))));
}

TEST(Layout, RejectsASequenceThatSequenceParallelismCannotSplit) {
  Layout layout = layout_of_file(R"({"model": "gpt2-124m", "tensor_parallel": 8, "devices": 8})");
  layout.sequence_parallel = true;
  layout.seq_length = 1000;
  validate_layout(layout);
  layout.seq_length = 1001;
  EXPECT_EQ(error_of([&] { validate_layout(layout); }),
            "seq_length 1001 is not a multiple of tensor_parallel 8: Megatron's sequence parallelism splits the "
            "sequence over the tensor-parallel ranks: use seq_length 1000 or 1008, another tensor_parallel, or drop "
            "sequence_parallel");
  layout.tensor_parallel = 1;
  layout.devices = 1;
  validate_layout(layout);  // t = 1: nothing to split
}

TEST(Layout, IsAProjectionOfTheResolvedRun) {
  const Layout layout = layout_of_file(R"({
    "train_batch_size": 48, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
    "zero_optimization": {"stage": 1},
    "pipeline": {"stages": 4, "partition_method": "uniform", "activation_checkpoint_interval": 1,
                 "schedule": "interleaved-1f1b", "virtual_stages": 2},
    "model": {"n_layer": 8, "n_head": 4, "n_embd": 128, "n_ctx": 64},
    "hardware": "a100-80g", "devices": 24, "tensor_parallel": 2, "data_parallel": 3,
    "sequence_parallel": true, "seq_length": 32, "comm_mode": "blocking"})");
  EXPECT_EQ(layout.devices, 24);
  EXPECT_EQ(layout.tensor_parallel, 2);
  EXPECT_EQ(layout.pipeline_ranks, 4);
  EXPECT_EQ(layout.data_parallel, 3);
  EXPECT_EQ(layout.micro_batch, 2);
  EXPECT_EQ(layout.global_batch, 48);
  EXPECT_EQ(layout.seq_length, 32);
  EXPECT_EQ(layout.chunks, 2);
  EXPECT_EQ(layout.recompute, Recompute::kFull);
  EXPECT_TRUE(layout.sequence_parallel);
  EXPECT_EQ(layout.zero, ZeroStage::kOne);
  EXPECT_EQ(layout.comm_mode, CommMode::kBlocking);
  EXPECT_EQ(microbatches_per_step(layout), 8);
  // Sequence parallelism at tensor_parallel 1 is off in the layout (a warning, as Megatron-LM).
  EXPECT_FALSE(layout_of_file(R"({"model": "gpt2-124m", "sequence_parallel": true})").sequence_parallel);
  // The model's context when seq_length is absent.
  EXPECT_EQ(layout_of_file(R"({"model": "gpt2-124m"})").seq_length, 1024);
}

}  // namespace
}  // namespace pipeflow
