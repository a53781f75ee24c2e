#pragma once

#include <CLI/CLI.hpp>

namespace pipeflow::cli {

// Each subcommand lives in its own file and adds itself to the application.
// A subcommand only parses options, calls library code and prints: no logic
// of its own. Errors are thrown as pipeflow::Error and reported by main.
// (Declarations are added here as subcommands arrive.)

void add_model_command(CLI::App& app);      // model_command.cc
void add_partition_command(CLI::App& app);  // partition_command.cc

}  // namespace pipeflow::cli
