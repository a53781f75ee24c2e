#pragma once

// MPI calls as the comm room makes them (and commbench's raw-MPI baseline).

#include <mpi.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>

#include "pipeflow/runtime/mpi_world.h"
#include "pipeflow/runtime/transport.h"

namespace pipeflow::runtime {

// Throws an Error "MPI_Isend failed: <MPI's message>" unless `code` is MPI_SUCCESS.
void check_mpi(int code, std::string_view call);

// Polls `request` until it completes (kOk), `deadline` passes (kTimedOut)
// or `abort` becomes true (kAborted). A wait first spins (MPI_Test in a
// loop: the message is usually near), then yields the core between tests,
// and after a millisecond sleeps 50 µs between them, so an oversubscribed
// process does not starve the peer it waits for. A request that did not
// complete stays active: its buffer must outlive it (the caller abandons
// both and the job ends: MpiWorld::abort_job). Cancelling is no way out: a
// cancelled transfer already under way can still block its MPI_Wait.
WaitStatus wait_for(MPI_Request& request, Deadline deadline, const std::atomic<bool>* abort = nullptr);

// Keeps `buffer` alive for the rest of the process: the buffer of a transfer
// that did not complete, which MPI may still read or write. Only on the way
// to ending the job after a failure (the memory is never given back).
void abandon_buffer(std::shared_ptr<void> buffer);

}  // namespace pipeflow::runtime
