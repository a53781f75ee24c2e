#include <exception>

#include "commands.h"
#include "pipeflow/runtime/mpi_world.h"

namespace pipeflow::cli {

void run_in_mpi_job(const std::function<void()>& body) {
  try {
    body();
  } catch (const ExitStatus&) {
    throw;
  } catch (const std::exception& error) {
    runtime::MpiWorld::fail_job(error.what());
  }
}

void run_here_or_in_mpi_job(const std::function<void(const runtime::MpiWorld*)>& body) {
  if (!runtime::MpiWorld::launched_by_mpirun()) return body(nullptr);
  const runtime::MpiWorld world;
  run_in_mpi_job([&] { body(&world); });
}

}  // namespace pipeflow::cli
