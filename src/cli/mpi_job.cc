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

}  // namespace pipeflow::cli
