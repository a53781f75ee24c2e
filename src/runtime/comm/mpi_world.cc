#include "pipeflow/runtime/mpi_world.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <cstdio>
#include <mutex>
#include <thread>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/adamw.h"

namespace pipeflow::runtime {
namespace {

constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kYield = std::chrono::milliseconds(1);
constexpr auto kSleep = std::chrono::microseconds(50);
constexpr int kClockTag = 1;

std::string ranks_line(const std::vector<int>& ranks) {
  std::string line;
  for (const int r : ranks) line += fmt::format(" {}", r);
  return line;
}

int as_int(std::size_t n, std::string_view what) {
  if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    fail("{}: {} elements do not fit one MPI message (at most {})", what, n, std::numeric_limits<int>::max());
  }
  return static_cast<int>(n);
}

}  // namespace

std::string RankLayout::describe() const {
  std::string text;
  for (int d = 0; d < data_parallel; ++d) {
    std::vector<int> ranks;
    for (int p = 0; p < pipeline; ++p) ranks.push_back(world_rank(p, d));
    text += fmt::format("pipeline (data-parallel rank {}): world ranks{}\n", d, ranks_line(ranks));
  }
  if (data_parallel > 1) {
    for (int p = 0; p < pipeline; ++p) {
      std::vector<int> ranks;
      for (int d = 0; d < data_parallel; ++d) ranks.push_back(world_rank(p, d));
      text += fmt::format("data-parallel group (pipeline rank {}): world ranks{}\n", p, ranks_line(ranks));
    }
  }
  return text;
}

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
  if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(1));
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

namespace {

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

}  // namespace

MpiGroups::MpiGroups(const MpiWorld& world, RankLayout layout)
    : world_(&world), layout_(layout), world_rank_(world.rank()) {
  if (world.size() != layout_.world_size()) {
    fail("mpirun started {} processes; the run needs pipeline.stages × data_parallel = {} × {} = {}: run mpirun -np "
         "{}, or set data_parallel to {} / {}",
         world.size(), layout_.pipeline, layout_.data_parallel, layout_.world_size(), layout_.world_size(),
         world.size(), layout_.pipeline);
  }
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, data_rank(), pipeline_rank(), &pipeline_), "MPI_Comm_split (pipeline)");
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, pipeline_rank(), data_rank(), &data_), "MPI_Comm_split (data parallel)");
  MPI_Comm_set_errhandler(pipeline_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
  clock_offset_s_ = measure_clock_offset();
}

MpiGroups::~MpiGroups() {
  MPI_Comm_free(&pipeline_);
  MPI_Comm_free(&data_);
}

// Cristian's algorithm against world rank 0, one peer at a time: rank 0
// answers each ping with its clock; the peer takes the reply of the
// shortest round trip and puts rank 0's time at that trip's midpoint.
double MpiGroups::measure_clock_offset() const {
  constexpr int kRounds = 16;
  const auto seconds = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
  const int size = layout_.world_size();
  if (world_rank_ == 0) {
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

namespace {

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

}  // namespace

void MpiGroups::all_gather_parts(MPI_Comm comm, std::span<float> values, Deadline deadline, std::string_view what) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  const auto [counts, offsets] = parts_of(static_cast<std::int64_t>(values.size()), size, what);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), counts.data(), offsets.data(),
                            MPI_FLOAT, comm, &request),
            "MPI_Iallgatherv");
  wait_or_end_job(request, deadline, what);
}

void MpiGroups::all_reduce_sum(MPI_Comm comm, std::span<float> values, Deadline deadline, std::string_view what) {
  ReduceScatterParts(comm, values, std::string(what)).finish(deadline);
  all_gather_parts(comm, values, deadline, what);
}

ReduceScatterParts::ReduceScatterParts(MPI_Comm comm, std::span<float> values, std::string what,
                                       std::size_t bucket_floats)
    : comm_(comm), values_(values), what_(std::move(what)) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank_);
  const auto [counts, offsets] = parts_of(static_cast<std::int64_t>(values.size()), size, what_);
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

void ReduceScatterParts::post_next() {
  Bucket& bucket = buckets_[posted_++];
  // In place, MPI takes the bucket from `values` and leaves this rank's share at the bucket's start.
  check_mpi(MPI_Ireduce_scatter(MPI_IN_PLACE, values_.data() + bucket.begin, bucket.counts.data(), MPI_FLOAT, MPI_SUM,
                                comm_, &bucket.request),
            "MPI_Ireduce_scatter");
}

void ReduceScatterParts::complete_front() {
  const Bucket& bucket = buckets_[completed_++];
  const auto count = static_cast<std::size_t>(bucket.counts[static_cast<std::size_t>(rank_)]);
  std::memmove(values_.data() + bucket.mine, values_.data() + bucket.begin, count * sizeof(float));
  if (posted_ < buckets_.size()) post_next();
}

void ReduceScatterParts::poll() {
  while (completed_ < posted_) {
    int done = 0;
    check_mpi(MPI_Test(&buckets_[completed_].request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done == 0) return;
    complete_front();
  }
}

void ReduceScatterParts::finish(Deadline deadline) {
  while (completed_ < posted_) {
    wait_or_end_job(buckets_[completed_].request, deadline, what_);
    complete_front();
  }
}

void MpiGroups::gather_parts(MPI_Comm comm, std::span<float> values, Deadline deadline, std::string_view what) {
  int size = 0;
  int rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  const auto [counts, offsets] = parts_of(static_cast<std::int64_t>(values.size()), size, what);
  const auto k = static_cast<std::size_t>(rank);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(rank == 0 ? MPI_Igatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), counts.data(),
                                     offsets.data(), MPI_FLOAT, 0, comm, &request)
                      : MPI_Igatherv(values.data() + offsets[k], counts[k], MPI_FLOAT, nullptr, nullptr, nullptr,
                                     MPI_FLOAT, 0, comm, &request),
            "MPI_Igatherv");
  wait_or_end_job(request, deadline, what);
}

std::vector<double> MpiGroups::all_gather(MPI_Comm comm, std::span<const double> values, Deadline deadline,
                                          std::string_view what) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  struct Buffers {
    std::vector<double> mine;
    std::vector<double> all;
  } buffers{{values.begin(), values.end()}, std::vector<double>(values.size() * static_cast<std::size_t>(size))};
  const int count = as_int(values.size(), what);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(buffers.mine.data(), count, MPI_DOUBLE, buffers.all.data(), count, MPI_DOUBLE, comm,
                           &request),
            "MPI_Iallgather");
  wait_collective(request, deadline, what, buffers);
  return std::move(buffers.all);
}

std::vector<std::string> MpiGroups::gather_bytes(MPI_Comm comm, const std::string& bytes, Deadline deadline,
                                                 std::string_view what) {
  int size = 0;
  int rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  const double length = static_cast<double>(bytes.size());
  const std::vector<double> lengths = all_gather(comm, {&length, 1}, deadline, what);
  struct Buffers {
    std::string mine;
    std::string all;
    std::vector<int> counts;
    std::vector<int> offsets;
  } buffers{bytes, {}, {}, {}};
  if (rank == 0) {
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
                         buffers.counts.data(), buffers.offsets.data(), MPI_BYTE, 0, comm, &request),
            "MPI_Igatherv");
  wait_collective(request, deadline, what, buffers);
  std::vector<std::string> parts;
  if (rank != 0) return parts;
  for (std::size_t r = 0; r < static_cast<std::size_t>(size); ++r) {
    parts.push_back(buffers.all.substr(static_cast<std::size_t>(buffers.offsets[r]),
                                       static_cast<std::size_t>(buffers.counts[r])));
  }
  return parts;
}

}  // namespace pipeflow::runtime
