#pragma once

#include <CLI/CLI.hpp>

namespace pipeflow::cli {

// Each subcommand lives in its own file and adds itself to the application.
// A subcommand only parses options, calls library code and prints: no logic
// of its own. Errors are thrown as pipeflow::Error and reported by main.
// (Declarations are added here as subcommands arrive.)

}  // namespace pipeflow::cli
