#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "commands.h"
#include "pipeflow/core/error.h"

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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version arrive as ParseErrors with exit code 0; CLI11 prints them.
    if (error.get_exit_code() == 0) return app.exit(error);
    std::fprintf(stderr, "pipeflow: error: %s (run with --help for the options)\n", error.what());
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
