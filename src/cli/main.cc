#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace {

constexpr std::size_t kMaxCliMessage = 400;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipeflow: plan, predict, run and explain pipeline-parallel training"};
  app.set_version_flag("--version", PIPEFLOW_VERSION);
  app.require_subcommand(1);
  app.fallthrough();

  pipeflow::cli::add_model_command(app);
  pipeflow::cli::add_partition_command(app);
  pipeflow::cli::add_schedule_command(app);
  pipeflow::cli::add_validate_command(app);
  pipeflow::cli::add_init_command(app);
  pipeflow::cli::add_grad_command(app);
  pipeflow::cli::add_calibrate_command(app);
  pipeflow::cli::add_train_command(app);
  pipeflow::cli::add_simulate_command(app);
  pipeflow::cli::add_analyze_command(app);
  pipeflow::cli::add_sweep_command(app);
  pipeflow::cli::add_generate_command(app);
  pipeflow::cli::add_plan_command(app);
  pipeflow::cli::add_advise_batch_command(app);
  pipeflow::cli::add_commbench_command(app);
  pipeflow::cli::add_review_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version arrive as ParseErrors with exit code 0; CLI11 prints them.
    if (error.get_exit_code() == 0) return app.exit(error);
    // CLI11 quotes the argument it refuses whole (up to 128 KiB): a message
    // longer than any of its own is cut as pipeflow cuts a user's value.
    std::string message = error.what();
    if (message.size() > kMaxCliMessage) message = pipeflow::quoted_excerpt(message, kMaxCliMessage);
    std::fprintf(stderr, "pipeflow: error: %s (run with --help for the options)\n", message.c_str());
    return error.get_exit_code();
  } catch (const pipeflow::cli::ExitStatus& exit) {
    return exit.status;
  } catch (const pipeflow::Error& error) {
    std::fprintf(stderr, "pipeflow: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pipeflow: internal error: %s\n", error.what());
    return 3;
  }
  return 0;
}
