#pragma once

#include <CLI/CLI.hpp>

#include <memory>

#include "pipeflow/config/run_config.h"

namespace pipeflow::cli {

// The flags that set keys of the run configuration, the same in every
// command that reads one (`train`, `simulate`): each is named after its key,
// with the short name users of Megatron-LM and nccl-tests type beside it
// (--stages/--pp, --tensor-parallel/--tp, --data-parallel/--dp,
// --seq-length/--seq). A flag given on the command line replaces its key;
// parse_run_config checks it exactly as the key.
class RunFlags {
 public:
  // Adds the flags to `app`; the object must outlive parsing.
  void add_to(CLI::App* app);
  // The flags that were given, as key overrides.
  RunOverrides overrides() const;

 private:
  CLI::App* app_ = nullptr;
  std::string model_, hardware_, schedule_, schedule_file_, recompute_, partition_, comm_;
  int devices_ = 0, tensor_parallel_ = 0, stages_ = 0, data_parallel_ = 0, micro_batch_ = 0, global_batch_ = 0,
      seq_length_ = 0, virtual_stages_ = 0, zero_ = 0;
  bool sequence_parallel_ = false;
};

// The run configuration of a command: the file `config_path` (empty: the
// defaults) with the flags' overrides.
RunConfig run_config_of(const std::string& config_path, const RunOverrides& overrides);

// On standard error: the configuration's warnings, and how its schedule file
// was read (the CSV dialect), as train and simulate both say them.
void print_config_notes(const RunConfig& config);

}  // namespace pipeflow::cli
