#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "pipeflow/model/pipeline_layers.h"

namespace pipeflow::cli {

// The options that say which model is run how, shared by `pipeflow model`
// and `pipeflow partition`: --model, --seq-length (--seq), --micro-batch, --tensor-parallel (--tp),
// --sequence-parallel, --recompute, --bytes-per-element.
struct ModelOptions {
  std::string model;
  int seq_length = 0;  // 0: the model's max_positions
  int micro_batch = 1;
  int tensor_parallel = 1;
  bool sequence_parallel = false;
  std::string recompute = "none";
  int bytes_per_element = 2;

  void add_to(CLI::App& command);
  ModelSpec spec() const;
  ParallelConfig config(const ModelSpec& spec) const;
};

}  // namespace pipeflow::cli
