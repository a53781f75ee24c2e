#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pipeflow/config/run_config.h"
#include "pipeflow/config/run_keys.h"

namespace pipeflow::cli {

// The flags that set keys of the run configuration, the same in every
// command that reads one, each from its row of run_keys() (name, aliases,
// help, default): `train` takes the rows of every scope, `sweep` those of
// FlagScope::kAll and kTraining, `simulate` those of kAll. A flag given on
// the command line replaces its key; parse_run_config checks it exactly as
// the key.
class RunFlags {
 public:
  // Adds the flags of the keys whose scope is one of `scopes`; the object
  // must outlive parsing.
  void add_to(CLI::App* app, std::initializer_list<FlagScope> scopes);
  // Adds the flags of the keys at `paths` (a command that reads a few keys
  // without a run configuration, as plan its freeze and lora).
  void add_to(CLI::App* app, std::initializer_list<std::string_view> paths);
  // The flags that were given, as key overrides.
  RunOverrides overrides() const;

 private:
  struct Flag {
    const RunKey* key = nullptr;
    CLI::Option* option = nullptr;
  };
  void add(CLI::App* app, const RunKey& key);

  std::vector<Flag> flags_;
  // Where CLI11 writes each flag's text (or, for a boolean, whether it was
  // given), by key path; map nodes do not move.
  std::map<std::string_view, std::string> text_;
  std::map<std::string_view, bool> set_;
};

// The run configuration of a command: the file `config_path` (empty: the
// defaults) with the flags' overrides.
RunConfig run_config_of(const std::string& config_path, const RunOverrides& overrides);

// Refuses block_launch_overhead_s > 0 beside a measured run (simulate's and
// plan's --profile): its durations already hold the run's host time.
void refuse_launch_overhead_with_profile(double block_launch_overhead_s);

// On standard error: the configuration's warnings, and how its schedule file
// was read (the CSV dialect), as train and simulate both say them.
void print_config_notes(const RunConfig& config);

}  // namespace pipeflow::cli
