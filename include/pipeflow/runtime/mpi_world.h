#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/config/run_config.h"
#include "pipeflow/runtime/transport.h"

namespace pipeflow::runtime {

// How the processes of a run under mpirun are arranged: p pipeline ranks
// times d data-parallel replicas, N = p · d processes, in Megatron-LM's order
// (tensor parallelism 1): the data-parallel rank varies fastest, so
//   world rank w = pipeline_rank · d + data_rank.
// A data-parallel group (the d processes holding the same stages, which
// all-reduce gradients: the heaviest traffic) is d consecutive ranks, on one
// machine when mpirun fills machines in order; a pipeline (one replica) is
// the ranks data_rank, data_rank + d, data_rank + 2d, ...
struct RankLayout {
  int pipeline = 1;       // p
  int data_parallel = 1;  // d

  int world_size() const { return pipeline * data_parallel; }
  int pipeline_rank(int world_rank) const { return world_rank / data_parallel; }
  int data_rank(int world_rank) const { return world_rank % data_parallel; }
  int world_rank(int pipeline_rank, int data_rank) const { return pipeline_rank * data_parallel + data_rank; }
  // One line per pipeline and per data-parallel group:
  //   "pipeline (data-parallel rank 0): world ranks 0 2 4 6"
  //   "data-parallel group (pipeline rank 1): world ranks 2 3"
  std::string describe() const;
};

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
  // rank 0 first pauses a second: when every process fails alike (a bad
  // configuration), rank 0's abort ends the others in that pause and the
  // message comes once.
  [[noreturn]] static void fail_job(std::string_view error);

 private:
  int rank_ = 0;
  int size_ = 1;
  std::string host_;
  int processes_on_host_ = 1;
  int first_rank_on_host_ = 0;
};

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

// The processes of one run: the world, this process's pipeline (its
// replica's p ranks, ranked by pipeline rank) and its data-parallel group
// (ranked by data rank), split from the world by RankLayout.
class MpiGroups {
 public:
  // Error when the world's size is not layout.world_size().
  MpiGroups(const MpiWorld& world, RankLayout layout);
  const std::string& host() const { return world_->host(); }
  int processes_on_host() const { return world_->processes_on_host(); }
  ~MpiGroups();
  MpiGroups(const MpiGroups&) = delete;
  MpiGroups& operator=(const MpiGroups&) = delete;

  const RankLayout& layout() const { return layout_; }
  int world_rank() const { return world_rank_; }
  int pipeline_rank() const { return layout_.pipeline_rank(world_rank_); }
  int data_rank() const { return layout_.data_rank(world_rank_); }
  // World rank 0: prints progress and writes the run's files.
  bool is_reporter() const { return world_rank_ == 0; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }
  MPI_Comm pipeline() const { return pipeline_; }
  MPI_Comm data() const { return data_; }
  // This process's steady clock minus world rank 0's, measured at start by
  // ping-pong (the exchange with the shortest round trip; 0 on rank 0). One
  // machine's processes share a clock and measure about 0.
  double clock_offset_s() const { return clock_offset_s_; }

  // Collectives, polled until `deadline` (an Error naming `what` after it):
  // the sum over `comm`'s ranks of `values`, in place: ReduceScatterParts,
  // then all_gather_parts (the ring all-reduce's two halves), so that every
  // element's sum has the same bits as under ZeRO-1, which stops halfway;
  static constexpr auto kBucketFloats = static_cast<std::size_t>(kReduceBucketSize);  // 16 MiB
  static void all_reduce_sum(MPI_Comm comm, std::span<float> values, Deadline deadline, std::string_view what);
  // every rank's `values` (the same count on each), rank by rank;
  static std::vector<double> all_gather(MPI_Comm comm, std::span<const double> values, Deadline deadline,
                                        std::string_view what);
  // every rank's part of `values` everywhere, in place: rank k's part is
  // nn::OptimizerShard::of(values.size(), ranks, k) and already in place;
  static void all_gather_parts(MPI_Comm comm, std::span<float> values, Deadline deadline, std::string_view what);
  // the same at rank 0 alone (the others' `values` unchanged);
  static void gather_parts(MPI_Comm comm, std::span<float> values, Deadline deadline, std::string_view what);
  // every rank's bytes at rank 0 (empty elsewhere), rank by rank.
  static std::vector<std::string> gather_bytes(MPI_Comm comm, const std::string& bytes, Deadline deadline,
                                               std::string_view what);

 private:
  double measure_clock_offset() const;

  const MpiWorld* world_;
  RankLayout layout_;
  int world_rank_ = 0;
  MPI_Comm pipeline_ = MPI_COMM_NULL;
  MPI_Comm data_ = MPI_COMM_NULL;
  double clock_offset_s_ = 0;
};

// The sum over `comm`'s ranks of `values`, reduced and scattered: rank k's
// part, nn::OptimizerShard::of(values.size(), ranks, k), ends as the sum
// of every rank's part k, and the rest of `values` is unspecified. One
// MPI_Ireduce_scatter per bucket of at most `bucket_floats`, two in flight
// (each holds MPI scratch of about two buckets at the root): the
// constructor posts the first two, poll() and finish() post the next as
// earlier ones complete and move this rank's share of each into place.
// MPI advances a posted bucket only inside MPI calls: the transport's
// between the pipeline's actions, and poll(), which the engine calls after
// each action. finish() waits for the rest (an Error naming `what` after
// `deadline`). `values` must outlive it; one destroyed unfinished belongs
// to a job that is ending (MpiWorld::fail_job).
class ReduceScatterParts {
 public:
  ReduceScatterParts(MPI_Comm comm, std::span<float> values, std::string what,
                     std::size_t bucket_floats = MpiGroups::kBucketFloats);
  ReduceScatterParts(const ReduceScatterParts&) = delete;
  ReduceScatterParts& operator=(const ReduceScatterParts&) = delete;
  void poll();
  void finish(Deadline deadline);

 private:
  static constexpr std::size_t kInFlight = 2;
  struct Bucket {
    std::size_t begin = 0;    // of values
    std::size_t mine = 0;     // where this rank's share of the bucket belongs
    std::vector<int> counts;  // each rank's share (alive until completion, as MPI requires)
    MPI_Request request = MPI_REQUEST_NULL;
  };
  void post_next();
  void complete_front();  // the oldest bucket in flight has completed

  MPI_Comm comm_;
  std::span<float> values_;
  std::string what_;
  int rank_ = 0;
  std::vector<Bucket> buckets_;
  std::size_t completed_ = 0;  // buckets_[completed_, posted_) are in flight
  std::size_t posted_ = 0;
};

}  // namespace pipeflow::runtime
