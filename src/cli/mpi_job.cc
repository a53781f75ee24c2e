#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "commands.h"
#include "pipeflow/runtime/mpi_world.h"

namespace pipeflow::cli {

void run_in_mpi_job(std::string_view command, const runtime::MpiWorld& mpi, const std::function<void()>& body) {
  try {
    body();
  } catch (const ExitStatus&) {
    throw;
  } catch (const std::exception& error) {
    fmt::print(stderr, "pipeflow {}: error in MPI process {} of {} on {}: {}\n", command, mpi.rank(), mpi.size(),
               mpi.host(), error.what());
    std::fflush(stderr);
    runtime::MpiWorld::abort_job(1);
  }
}

}  // namespace pipeflow::cli
