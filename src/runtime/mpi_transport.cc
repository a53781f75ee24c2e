#include "pipeflow/runtime/mpi_transport.h"

#include <fmt/format.h>

#include <algorithm>

#include "pipeflow/core/error.h"
#include "pipeflow/runtime/mpi_world.h"

namespace pipeflow::runtime {

MpiTransport::MpiTransport(MPI_Comm pipeline, RankId self, int num_stages, int num_microbatches)
    : comm_(pipeline), self_(self), num_stages_(num_stages), num_microbatches_(num_microbatches) {
  int* upper = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &found);
  const std::int64_t largest = 3LL * num_stages_ * num_microbatches_;
  if (found != 0 && largest > *upper) {
    fail("{} stages × {} micro-batches × 3 directions need MPI tags up to {}, and this MPI library allows {}: use "
         "fewer micro-batches per step",
         num_stages_, num_microbatches_, largest, *upper);
  }
}

MpiTransport::~MpiTransport() {
  for (PendingSend& send : sends_) {
    MPI_Cancel(&send.request);
    MPI_Wait(&send.request, MPI_STATUS_IGNORE);
  }
}

int MpiTransport::tag(const MessageKey& key) const {
  return (static_cast<int>(key.direction) * num_stages_ + key.stage.value()) * num_microbatches_ +
         key.microbatch.value();
}

void MpiTransport::progress_sends() {
  std::erase_if(sends_, [](PendingSend& send) {
    int done = 0;
    check_mpi(MPI_Test(&send.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  });
}

void MpiTransport::check_count(const MessageKey& key, const MPI_Status& status, std::int64_t expected) const {
  int count = 0;
  MPI_Get_count(&status, MPI_FLOAT, &count);
  if (count != expected) {
    fail("rank {}: the {} holds {} floats, {} expected: the ranks run different models or micro-batch shapes",
         self_, describe(key), count, expected);
  }
}

WaitStatus MpiTransport::send(const MessageKey& key, Tensor payload, Deadline) {
  if (aborted()) return WaitStatus::kAborted;
  progress_sends();
  PendingSend& send = sends_.emplace_back();
  send.payload = std::move(payload);
  check_mpi(MPI_Isend(send.payload.data(), static_cast<int>(send.payload.numel()), MPI_FLOAT,
                      key.destination.value(), tag(key), comm_, &send.request),
            "MPI_Isend");
  return WaitStatus::kOk;
}

WaitStatus MpiTransport::receive(const MessageKey& key, const Shape& shape, Allocator allocator, Deadline deadline,
                                 Tensor& out) {
  if (aborted()) return WaitStatus::kAborted;
  progress_sends();
  Tensor into = Tensor::uninitialized(shape, allocator);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Irecv(into.data(), static_cast<int>(into.numel()), MPI_FLOAT, key.source.value(), tag(key), comm_,
                      &request),
            "MPI_Irecv");
  const WaitStatus status = wait_for(request, deadline, &aborted_, true);
  if (status == WaitStatus::kOk) out = std::move(into);
  return status;
}

bool MpiTransport::try_receive(const MessageKey& key, const Shape& shape, Allocator allocator, Tensor& out) {
  if (aborted()) return false;
  progress_sends();
  int arrived = 0;
  MPI_Status status;
  check_mpi(MPI_Iprobe(key.source.value(), tag(key), comm_, &arrived, &status), "MPI_Iprobe");
  if (arrived == 0) return false;
  Tensor into = Tensor::uninitialized(shape, allocator);
  check_count(key, status, into.numel());
  check_mpi(MPI_Recv(into.data(), static_cast<int>(into.numel()), MPI_FLOAT, key.source.value(), tag(key), comm_,
                     MPI_STATUS_IGNORE),
            "MPI_Recv");
  out = std::move(into);
  return true;
}

WaitStatus MpiTransport::all_reduce_sum(RankId, double& value, Deadline deadline) {
  if (aborted()) return WaitStatus::kAborted;
  progress_sends();
  int size = 0;
  MPI_Comm_size(comm_, &size);
  std::vector<double> values(static_cast<std::size_t>(size));
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(&value, 1, MPI_DOUBLE, values.data(), 1, MPI_DOUBLE, comm_, &request), "MPI_Iallgather");
  const WaitStatus status = wait_for(request, deadline);
  if (status != WaitStatus::kOk) return status;  // the caller fails the step, and the job ends
  double sum = 0;
  for (const double v : values) sum += v;
  value = sum;
  return WaitStatus::kOk;
}

void MpiTransport::reset() {
  const Deadline deadline = Clock::now() + std::chrono::seconds(60);
  while (!sends_.empty() && Clock::now() < deadline) progress_sends();
  for (PendingSend& send : sends_) {
    MPI_Cancel(&send.request);
    MPI_Wait(&send.request, MPI_STATUS_IGNORE);
  }
  sends_.clear();
  aborted_.store(false, std::memory_order_release);
}

}  // namespace pipeflow::runtime
