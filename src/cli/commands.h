#pragma once

#include <functional>
#include <string>
#include <string_view>

// Declared only: a subcommand's file includes <CLI/CLI.hpp> itself (about
// 11 s of compiler CPU a file), a file that only runs jobs does not.
namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace pipeflow::runtime {
class MpiWorld;
}  // namespace pipeflow::runtime

namespace pipeflow::cli {

// Each subcommand lives in its own file and adds itself to the application.
// A subcommand parses options, calls library code and prints; some still
// hold logic that belongs in a library (plan's three exporters and its
// constrained re-search, plan_command.cc: issue 21 moves them). Errors are
// thrown as pipeflow::Error and reported by main.
// (Declarations are added here as subcommands arrive.)

void add_model_command(CLI::App& app);      // model_command.cc
void add_partition_command(CLI::App& app);  // partition_command.cc
void add_schedule_command(CLI::App& app);   // schedule_command.cc
void add_validate_command(CLI::App& app);   // validate_command.cc
void add_init_command(CLI::App& app);       // init_command.cc
void add_grad_command(CLI::App& app);       // grad_command.cc
void add_calibrate_command(CLI::App& app);  // calibrate_command.cc
void add_train_command(CLI::App& app);      // train_command.cc
void add_simulate_command(CLI::App& app);   // simulate_command.cc
void add_analyze_command(CLI::App& app);    // analyze_command.cc
void add_sweep_command(CLI::App& app);      // sweep_command.cc
void add_generate_command(CLI::App& app);   // generate_command.cc
void add_plan_command(CLI::App& app);       // plan_command.cc
void add_advise_batch_command(CLI::App& app);  // advise_batch_command.cc
void add_commbench_command(CLI::App& app);  // commbench_command.cc
void add_review_command(CLI::App& app);     // review_command.cc

// Thrown by a command that has done its work but must end the process with
// `status` (train stopped by a signal: 128 + its number); main returns it.
struct ExitStatus {
  int status = 0;
};

// Refuses a negative --seed, which CLI11 would wrap into a huge unsigned
// value (init_command.cc).
CLI::Validator non_negative_seed();
// Under mpirun: runs `body`; a process whose body throws prints why, naming
// itself ("pipeflow: error in MPI process R of N on HOST: ..."), and ends
// the whole job (MpiWorld::fail_job), so that no peer waits for it until its
// timeout. ExitStatus passes through. (mpi_job.cc)
void run_in_mpi_job(const std::function<void()>& body);
// body(nullptr) in a process that mpirun did not start; under mpirun,
// body(&world) in run_in_mpi_job, with MPI up for the body's life. (mpi_job.cc)
void run_here_or_in_mpi_job(const std::function<void(const runtime::MpiWorld*)>& body);

// Writes `text` to `path` atomically, or to standard output if `path` is empty.
void write_output(const std::string& text, const std::string& path);

}  // namespace pipeflow::cli
