#include "pipeflow/runtime/mpi_world.h"

#include "comm/mpi.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <mutex>
#include <thread>

#include "pipeflow/core/error.h"

namespace pipeflow::runtime {
namespace {

constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kYield = std::chrono::milliseconds(1);
constexpr auto kSleep = std::chrono::microseconds(50);

}  // namespace

bool MpiWorld::launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

MpiWorld::MpiWorld() {
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    fail("this MPI library gives thread support level {} and pipeflow needs MPI_THREAD_SERIALIZED ({}): use an "
         "OpenMPI built with thread support (Debian's openmpi-bin is)",
         provided, MPI_THREAD_SERIALIZED);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  host_.assign(name, static_cast<std::size_t>(length));
  MPI_Comm host = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host),
            "MPI_Comm_split_type");
  MPI_Comm_size(host, &processes_on_host_);
  check_mpi(MPI_Allreduce(&rank_, &first_rank_on_host_, 1, MPI_INT, MPI_MIN, host), "MPI_Allreduce (host)");
  MPI_Comm_free(&host);
}

MpiWorld::~MpiWorld() { MPI_Finalize(); }

void MpiWorld::abort_job(int status) {
  MPI_Abort(MPI_COMM_WORLD, status);
  std::_Exit(status);  // MPI_Abort does not return; should it, end this process anyway
}

void MpiWorld::fail_job(std::string_view error) {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(3));
  std::fprintf(stderr, "pipeflow: error in MPI process %d of %d on %.*s: %.*s\n", rank, size, length, host,
               static_cast<int>(error.size()), error.data());
  std::fflush(stderr);
  abort_job(1);
}

void check_mpi(int code, std::string_view call) {
  if (code == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, message, &length);
  fail("{} failed: {}", call, std::string_view(message, static_cast<std::size_t>(length)));
}

WaitStatus wait_for(MPI_Request& request, Deadline deadline, const std::atomic<bool>* abort) {
  const Clock::time_point start = Clock::now();
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done != 0) return WaitStatus::kOk;
    const Clock::time_point now = Clock::now();
    if (abort != nullptr && abort->load(std::memory_order_acquire)) return WaitStatus::kAborted;
    if (now > deadline) return WaitStatus::kTimedOut;
    const auto waited = now - start;
    if (waited < kSpin) continue;
    if (waited < kYield) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kSleep);
    }
  }
}

void abandon_buffer(std::shared_ptr<void> buffer) {
  static std::mutex mutex;
  static auto* abandoned = new std::vector<std::shared_ptr<void>>;  // never freed, on purpose
  const std::lock_guard lock(mutex);
  abandoned->push_back(std::move(buffer));
}

}  // namespace pipeflow::runtime
