#pragma once

#include <mpi.h>

#include <string>
#include <string_view>

namespace pipeflow::runtime {

// MPI for the life of a command started by mpirun: MPI_Init_thread with
// MPI_THREAD_SERIALIZED (one thread at a time calls MPI: a rank's worker
// thread during a step, the main thread between steps), MPI_Finalize at the
// end. Errors of MPI calls are returned, not fatal (MPI_ERRORS_RETURN), and
// become pipeflow Errors naming the call.
class MpiWorld {
 public:
  // Whether this process was started by mpirun (OpenMPI sets OMPI_COMM_WORLD_SIZE).
  static bool launched_by_mpirun();

  MpiWorld();
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // This machine's name (MPI_Get_processor_name) and how many of the job's
  // processes run on it (MPI_COMM_TYPE_SHARED).
  const std::string& host() const { return host_; }
  int processes_on_host() const { return processes_on_host_; }
  // The lowest world rank on this machine: equal for two processes exactly
  // when they share a machine.
  int first_rank_on_host() const { return first_rank_on_host_; }

  // Ends every process of the job (MPI_Abort) with `status`: for a process
  // that failed, after it has printed why, so that no peer waits for it.
  [[noreturn]] static void abort_job(int status);
  // Prints "pipeflow: error in MPI process R of N on HOST: ERROR" and ends
  // the job with status 1, at once: nothing is unwound, so no buffer an
  // unfinished transfer still uses is freed. A process other than world
  // rank 0 first pauses three seconds: when every process fails alike (a
  // bad configuration), rank 0's abort ends the others in that pause and the
  // message comes once. (One second was too short for 4 processes on 2
  // busy cores: a CI run saw all four print.)
  [[noreturn]] static void fail_job(std::string_view error);

 private:
  int rank_ = 0;
  int size_ = 1;
  std::string host_;
  int processes_on_host_ = 1;
  int first_rank_on_host_ = 0;
};

}  // namespace pipeflow::runtime
