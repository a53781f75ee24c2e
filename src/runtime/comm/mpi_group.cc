// The rank group whose ranks are the processes of an MPI job (one rank a
// process): its collectives are MPI's non-blocking ones, polled until their
// deadline; its transport is MpiTransport over the pipeline's communicator.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "comm/mpi.h"
#include "comm/mpi_transport.h"
#include "pipeflow/core/error.h"
#include "pipeflow/nn/adamw.h"
#include "pipeflow/runtime/mpi_world.h"
#include "pipeflow/runtime/rank_group.h"

namespace pipeflow::runtime {
namespace {

constexpr int kClockTag = 1;

int as_int(std::size_t n, std::string_view what) {
  if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    fail("{}: {} elements do not fit one MPI message (at most {})", what, n, std::numeric_limits<int>::max());
  }
  return static_cast<int>(n);
}

std::string timed_out(Clock::time_point start, std::string_view what) {
  return fmt::format("timed out after {:.0f} s waiting for {} (a peer process is stuck or gone; raise --timeout if "
                     "it is only slow)",
                     std::chrono::duration<double>(Clock::now() - start).count(), what);
}

// A collective's wait: an Error naming `what` when the deadline passes (the
// buffer, `keep`, abandoned to the transfer).
template <typename Buffer>
void wait_collective(MPI_Request& request, Deadline deadline, std::string_view what, Buffer& keep) {
  const Clock::time_point start = Clock::now();
  if (wait_for(request, deadline) == WaitStatus::kOk) return;
  abandon_buffer(std::make_shared<Buffer>(std::move(keep)));
  fail("{}", timed_out(start, what));
}

// A collective's wait on the caller's buffer, which cannot be abandoned: the
// job ends at once when the deadline passes.
void wait_or_end_job(MPI_Request& request, Deadline deadline, std::string_view what) {
  const Clock::time_point start = Clock::now();
  if (wait_for(request, deadline) != WaitStatus::kOk) MpiWorld::fail_job(timed_out(start, what));
}

// The counts and offsets of every rank's part of `total` floats (nn::OptimizerShard::of).
std::pair<std::vector<int>, std::vector<int>> parts_of(std::int64_t total, int size, std::string_view what) {
  std::vector<int> counts;
  std::vector<int> offsets;
  for (int k = 0; k < size; ++k) {
    const nn::OptimizerShard part = nn::OptimizerShard::of(total, size, k);
    counts.push_back(as_int(static_cast<std::size_t>(part.size()), what));
    offsets.push_back(as_int(static_cast<std::size_t>(part.begin), what));
  }
  return {std::move(counts), std::move(offsets)};
}

// One MPI_Ireduce_scatter per bucket of at most `bucket_floats`, two in
// flight (each holds MPI scratch of about two buckets at the root): the
// constructor posts the first two, poll() and finish() post the next as
// earlier ones complete and move this rank's share of each into place. MPI
// advances a posted bucket only inside MPI calls: the transport's between
// the pipeline's actions, and poll(), which the engine calls after each
// action. One destroyed unfinished belongs to a job that is ending
// (MpiWorld::fail_job).
class MpiReduceScatter final : public PartsReduction {
 public:
  MpiReduceScatter(MPI_Comm comm, std::span<float> values, std::string what, std::size_t bucket_floats)
      : comm_(comm), values_(values), what_(std::move(what)) {
    int size = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank_);
    const auto [counts, offsets] = parts_of(static_cast<std::int64_t>(values.size()), size, what_);
    bucket_floats = std::max<std::size_t>(bucket_floats, 1);
    buckets_.reserve((values.size() + bucket_floats - 1) / bucket_floats);
    for (std::size_t begin = 0; begin < values.size(); begin += bucket_floats) {
      const std::size_t end = std::min(values.size(), begin + bucket_floats);
      Bucket& bucket = buckets_.emplace_back();
      bucket.begin = begin;
      for (int k = 0; k < size; ++k) {  // rank k's share: its part within [begin, end)
        const auto k_part = static_cast<std::size_t>(k);
        const std::size_t from = std::max(begin, static_cast<std::size_t>(offsets[k_part]));
        const std::size_t to = std::min(end, static_cast<std::size_t>(offsets[k_part]) + counts[k_part]);
        bucket.counts.push_back(to > from ? static_cast<int>(to - from) : 0);
        if (k == rank_) bucket.mine = from;
      }
    }
    while (posted_ < buckets_.size() && posted_ < kInFlight) post_next();
  }
  MpiReduceScatter(const MpiReduceScatter&) = delete;
  MpiReduceScatter& operator=(const MpiReduceScatter&) = delete;

  void poll() override {
    while (completed_ < posted_) {
      int done = 0;
      check_mpi(MPI_Test(&buckets_[completed_].request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done == 0) return;
      complete_front();
    }
  }

  void finish(Deadline deadline) override {
    while (completed_ < posted_) {
      wait_or_end_job(buckets_[completed_].request, deadline, what_);
      complete_front();
    }
  }

 private:
  static constexpr std::size_t kInFlight = 2;
  struct Bucket {
    std::size_t begin = 0;    // of values
    std::size_t mine = 0;     // where this rank's share of the bucket belongs
    std::vector<int> counts;  // each rank's share (alive until completion, as MPI requires)
    MPI_Request request = MPI_REQUEST_NULL;
  };

  void post_next() {
    Bucket& bucket = buckets_[posted_++];
    // In place, MPI takes the bucket from `values` and leaves this rank's share at the bucket's start.
    check_mpi(MPI_Ireduce_scatter(MPI_IN_PLACE, values_.data() + bucket.begin, bucket.counts.data(), MPI_FLOAT,
                                  MPI_SUM, comm_, &bucket.request),
              "MPI_Ireduce_scatter");
  }

  // The oldest bucket in flight has completed.
  void complete_front() {
    const Bucket& bucket = buckets_[completed_++];
    const auto count = static_cast<std::size_t>(bucket.counts[static_cast<std::size_t>(rank_)]);
    std::memmove(values_.data() + bucket.mine, values_.data() + bucket.begin, count * sizeof(float));
    if (posted_ < buckets_.size()) post_next();
  }

  MPI_Comm comm_;
  std::span<float> values_;
  std::string what_;
  int rank_ = 0;
  std::vector<Bucket> buckets_;
  std::size_t completed_ = 0;  // buckets_[completed_, posted_) are in flight
  std::size_t posted_ = 0;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes `comm` (freed with the communicator unless it is MPI_COMM_WORLD).
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(comm_, &rank_);
  }
  ~MpiCommunicator() override {
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  MPI_Comm comm() const { return comm_; }
  int size() const override { return size_; }
  int rank() const override { return rank_; }

  std::vector<double> all_gather(std::span<const double> values, Deadline deadline, std::string_view what) override {
    struct Buffers {
      std::vector<double> mine;
      std::vector<double> all;
    } buffers{{values.begin(), values.end()}, std::vector<double>(values.size() * static_cast<std::size_t>(size_))};
    const int count = as_int(values.size(), what);
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(buffers.mine.data(), count, MPI_DOUBLE, buffers.all.data(), count, MPI_DOUBLE, comm_,
                             &request),
              "MPI_Iallgather");
    wait_collective(request, deadline, what, buffers);
    return std::move(buffers.all);
  }

  std::unique_ptr<PartsReduction> reduce_scatter_parts(std::span<float> values, std::string what,
                                                       std::size_t bucket_floats) override {
    return std::make_unique<MpiReduceScatter>(comm_, values, std::move(what), bucket_floats);
  }

  void all_gather_parts(std::span<float> values, Deadline deadline, std::string_view what) override {
    const auto [counts, offsets] = parts_of(static_cast<std::int64_t>(values.size()), size_, what);
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), counts.data(), offsets.data(),
                              MPI_FLOAT, comm_, &request),
              "MPI_Iallgatherv");
    wait_or_end_job(request, deadline, what);
  }

  void gather_parts(std::span<float> values, Deadline deadline, std::string_view what) override {
    const auto [counts, offsets] = parts_of(static_cast<std::int64_t>(values.size()), size_, what);
    const auto k = static_cast<std::size_t>(rank_);
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(rank_ == 0 ? MPI_Igatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), counts.data(),
                                        offsets.data(), MPI_FLOAT, 0, comm_, &request)
                         : MPI_Igatherv(values.data() + offsets[k], counts[k], MPI_FLOAT, nullptr, nullptr, nullptr,
                                        MPI_FLOAT, 0, comm_, &request),
              "MPI_Igatherv");
    wait_or_end_job(request, deadline, what);
  }

  std::vector<std::string> gather_bytes(const std::string& bytes, Deadline deadline, std::string_view what) override {
    const double length = static_cast<double>(bytes.size());
    const std::vector<double> lengths = all_gather({&length, 1}, deadline, what);
    struct Buffers {
      std::string mine;
      std::string all;
      std::vector<int> counts;
      std::vector<int> offsets;
    } buffers{bytes, {}, {}, {}};
    if (rank_ == 0) {
      std::size_t total = 0;
      for (const double l : lengths) {
        buffers.offsets.push_back(as_int(total, what));
        buffers.counts.push_back(as_int(static_cast<std::size_t>(l), what));
        total += static_cast<std::size_t>(l);
      }
      buffers.all.resize(total);
    }
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Igatherv(buffers.mine.data(), as_int(buffers.mine.size(), what), MPI_BYTE, buffers.all.data(),
                           buffers.counts.data(), buffers.offsets.data(), MPI_BYTE, 0, comm_, &request),
              "MPI_Igatherv");
    wait_collective(request, deadline, what, buffers);
    std::vector<std::string> parts;
    if (rank_ != 0) return parts;
    for (std::size_t r = 0; r < static_cast<std::size_t>(size_); ++r) {
      parts.push_back(buffers.all.substr(static_cast<std::size_t>(buffers.offsets[r]),
                                         static_cast<std::size_t>(buffers.counts[r])));
    }
    return parts;
  }

  void broadcast_bytes(std::string& bytes, Deadline deadline, std::string_view what) override {
    double length = static_cast<double>(bytes.size());
    length = all_gather({&length, 1}, deadline, what).front();
    struct Buffers {
      std::string data;
    } buffers{rank_ == 0 ? bytes : std::string(static_cast<std::size_t>(length), '\0')};
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(buffers.data.data(), as_int(buffers.data.size(), what), MPI_BYTE, 0, comm_, &request),
              "MPI_Ibcast");
    wait_collective(request, deadline, what, buffers);
    bytes = std::move(buffers.data);
  }

 private:
  MPI_Comm comm_;
  int size_ = 1;
  int rank_ = 0;
};

class ProcessGroup final : public RankGroup {
 public:
  ProcessGroup(const MpiWorld& world, RankLayout layout) : RankGroup(layout, {world.rank()}), world_(&world) {
    if (world.size() != layout.world_size()) {
      fail("mpirun started {} processes; the run needs pipeline.stages × data_parallel × tensor_parallel = {} × {} "
           "× {} = {}: run mpirun -np {}, or set data_parallel to {} / ({} × {})",
           world.size(), layout.pipeline, layout.data_parallel, layout.tensor, layout.world_size(),
           layout.world_size(), world.size(), layout.pipeline, layout.tensor);
    }
    const int w = world.rank();
    const int t = layout.tensor;
    const int d = layout.data_parallel;
    MPI_Comm pipeline = MPI_COMM_NULL;
    MPI_Comm data = MPI_COMM_NULL;
    MPI_Comm tensor = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(MPI_COMM_WORLD, layout.data_rank(w) * t + layout.tensor_rank(w), layout.pipeline_rank(w),
                             &pipeline),
              "MPI_Comm_split (pipeline)");
    check_mpi(MPI_Comm_split(MPI_COMM_WORLD, layout.pipeline_rank(w) * t + layout.tensor_rank(w), layout.data_rank(w),
                             &data),
              "MPI_Comm_split (data parallel)");
    check_mpi(MPI_Comm_split(MPI_COMM_WORLD, layout.pipeline_rank(w) * d + layout.data_rank(w), layout.tensor_rank(w),
                             &tensor),
              "MPI_Comm_split (tensor parallel)");
    world_comm_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    pipeline_ = std::make_unique<MpiCommunicator>(pipeline);
    data_ = std::make_unique<MpiCommunicator>(data);
    tensor_ = std::make_unique<MpiCommunicator>(tensor);
    clock_offset_s_ = measure_clock_offset();
  }

  bool spans_processes() const override { return true; }
  bool shares_process(int a, int b) const override { return a == b; }
  Communicator& world(int w) override { return mine(w, *world_comm_); }
  Communicator& pipeline(int w) override { return mine(w, *pipeline_); }
  Communicator& data(int w) override { return mine(w, *data_); }
  Communicator& tensor(int w) override { return mine(w, *tensor_); }

  std::unique_ptr<Transport> pipeline_transport(int data_rank, int tensor_rank,
                                                const PipelineTraffic& traffic) override {
    if (data_rank != layout().data_rank(world_->rank()) || tensor_rank != layout().tensor_rank(world_->rank())) {
      fail("the pipeline of data-parallel rank {}, tensor-parallel rank {} runs in other processes", data_rank,
           tensor_rank);
    }
    return std::make_unique<MpiTransport>(pipeline_->comm(), RankId(layout().pipeline_rank(world_->rank())),
                                          traffic.stages, traffic.microbatches, traffic.wire);
  }

  // One rank per process, on this thread: mpirun binds the process to its core.
  void run(const std::function<void(int)>& job, const std::function<void()>& /*abort*/) override {
    try {
      job(world_->rank());
    } catch (const std::exception& error) {
      // Peers in other processes cannot be told to stop half way, and
      // transfers of this one may still be under way: end the job from here.
      MpiWorld::fail_job(error.what());
    }
  }

  double max_over_processes(double value, Deadline deadline, std::string_view what) override {
    const std::vector<double> all = world_comm_->all_gather({&value, 1}, deadline, what);
    return *std::max_element(all.begin(), all.end());
  }

  double clock_offset_s() const override { return clock_offset_s_; }

  std::string placement() const override {
    const RankLayout& l = layout();
    return fmt::format("{} MPI processes ({}), {} on this machine ({}, {} cores)", l.world_size(), l.dimensions(),
                       world_->processes_on_host(), world_->host(), std::thread::hardware_concurrency());
  }

  std::string oversubscription(bool /*emulated*/, bool /*can_emulate*/) const override {
    const int here = world_->processes_on_host();
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    if (here <= cores) return "";
    return fmt::format("{} MPI processes share {} cores on this machine (oversubscribed): correct, but the measured "
                       "step time, tokens/s and bubble are not those of a pipeline with one device per rank.",
                       here, cores);
  }

 private:
  Communicator& mine(int w, Communicator& comm) const {
    if (w != world_->rank()) fail("world rank {} runs in another process (this is world rank {})", w, world_->rank());
    return comm;
  }

  // Cristian's algorithm against world rank 0, one peer at a time: rank 0
  // answers each ping with its clock; the peer takes the reply of the
  // shortest round trip and puts rank 0's time at that trip's midpoint.
  double measure_clock_offset() const {
    constexpr int kRounds = 16;
    const auto seconds = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
    const int size = layout().world_size();
    if (world_->rank() == 0) {
      for (int peer = 1; peer < size; ++peer) {
        for (int i = 0; i < kRounds; ++i) {
          double ping = 0;
          check_mpi(MPI_Recv(&ping, 1, MPI_DOUBLE, peer, kClockTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
          const double now = seconds();
          check_mpi(MPI_Send(&now, 1, MPI_DOUBLE, peer, kClockTag, MPI_COMM_WORLD), "MPI_Send");
        }
      }
      return 0;
    }
    double best_trip = std::numeric_limits<double>::infinity();
    double offset = 0;
    for (int i = 0; i < kRounds; ++i) {
      const double sent = seconds();
      double theirs = 0;
      check_mpi(MPI_Send(&sent, 1, MPI_DOUBLE, 0, kClockTag, MPI_COMM_WORLD), "MPI_Send");
      check_mpi(MPI_Recv(&theirs, 1, MPI_DOUBLE, 0, kClockTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
      const double received = seconds();
      if (received - sent < best_trip) {
        best_trip = received - sent;
        offset = (sent + received) / 2 - theirs;
      }
    }
    return offset;
  }

  const MpiWorld* world_;
  std::unique_ptr<MpiCommunicator> world_comm_;
  std::unique_ptr<MpiCommunicator> pipeline_;
  std::unique_ptr<MpiCommunicator> data_;
  std::unique_ptr<MpiCommunicator> tensor_;
  double clock_offset_s_ = 0;
};

}  // namespace

std::unique_ptr<RankGroup> RankGroup::in_processes(const MpiWorld& world, RankLayout layout) {
  return std::make_unique<ProcessGroup>(world, layout);
}

}  // namespace pipeflow::runtime
