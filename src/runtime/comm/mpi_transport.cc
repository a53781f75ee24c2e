#include "comm/mpi_transport.h"

#include "comm/mpi.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "pipeflow/core/error.h"
#include "pipeflow/runtime/mpi_world.h"

namespace pipeflow::runtime {

MpiTransport::MpiTransport(MPI_Comm pipeline, RankId self, int num_stages, int num_microbatches,
                           ComputeFormat wire)
    : comm_(pipeline), self_(self), num_stages_(num_stages), num_microbatches_(num_microbatches), wire_(wire) {
  int* upper = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &found);
  const std::int64_t largest = message_tags(num_stages_, num_microbatches_) - 1;
  if (found != 0 && largest > *upper) {
    fail("{} stages × {} micro-batches × 3 directions need MPI tags up to {}, and this MPI library allows {}: use "
         "fewer micro-batches per step",
         num_stages_, num_microbatches_, largest, *upper);
  }
}

MpiTransport::~MpiTransport() { abandon_sends(); }

void MpiTransport::abandon_sends() {
  for (PendingSend& send : sends_) {
    abandon_buffer(std::make_shared<Tensor>(std::move(send.payload)));
    if (send.packed) abandon_buffer(std::move(send.packed));
  }
  sends_.clear();
}

void MpiTransport::unpack(const std::vector<std::uint16_t>& packed, Tensor& into) const {
  from_half_bits(wire_, packed.data(), into.data(), static_cast<std::int64_t>(packed.size()));
}

std::vector<std::string> MpiTransport::sends_in_flight() const {
  std::vector<std::string> names;
  for (const PendingSend& send : sends_) names.push_back(describe(send.key));
  return names;
}

int MpiTransport::tag(const MessageKey& key) const { return message_tag(key, num_stages_, num_microbatches_); }

void MpiTransport::progress_sends() {
  std::erase_if(sends_, [](PendingSend& send) {
    int done = 0;
    check_mpi(MPI_Test(&send.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  });
}

void MpiTransport::check_count(const MessageKey& key, const MPI_Status& status, std::int64_t expected) const {
  int count = 0;
  MPI_Get_count(&status, packs(key) ? MPI_UINT16_T : MPI_FLOAT, &count);
  if (count != expected) {
    fail("rank {}: the {} holds {} values, {} expected: the ranks run different models, micro-batch shapes or "
         "precisions",
         self_, describe(key), count, expected);
  }
}

WaitStatus MpiTransport::send(const MessageKey& key, Tensor payload, Deadline) {
  if (aborted()) return WaitStatus::kAborted;
  progress_sends();
  PendingSend& send = sends_.emplace_back();
  send.key = key;
  send.payload = std::move(payload);
  const int count = static_cast<int>(send.payload.numel());
  if (packs(key)) {
    send.packed = std::make_shared<std::vector<std::uint16_t>>(static_cast<std::size_t>(count));
    to_half_bits(wire_, send.payload.data(), send.packed->data(), count);
    check_mpi(MPI_Isend(send.packed->data(), count, MPI_UINT16_T, key.destination.value(), tag(key), comm_, &send.request),
              "MPI_Isend");
    return WaitStatus::kOk;
  }
  check_mpi(MPI_Isend(send.payload.data(), count, MPI_FLOAT, key.destination.value(), tag(key), comm_, &send.request),
            "MPI_Isend");
  return WaitStatus::kOk;
}

WaitStatus MpiTransport::receive(const MessageKey& key, const Shape& shape, Allocator allocator, Deadline deadline,
                                 Tensor& out) {
  if (aborted()) return WaitStatus::kAborted;
  progress_sends();
  Tensor into = Tensor::uninitialized(shape, allocator);
  MPI_Request request = MPI_REQUEST_NULL;
  const int count = static_cast<int>(into.numel());
  if (packs(key)) {
    auto packed = std::make_shared<std::vector<std::uint16_t>>(static_cast<std::size_t>(count));
    check_mpi(MPI_Irecv(packed->data(), count, MPI_UINT16_T, key.source.value(), tag(key), comm_, &request),
              "MPI_Irecv");
    const WaitStatus status = wait_for(request, deadline, &aborted_);
    if (status == WaitStatus::kOk) {
      unpack(*packed, into);
      out = std::move(into);
    } else {
      abandon_buffer(std::move(packed));  // the receive stays posted
    }
    return status;
  }
  check_mpi(MPI_Irecv(into.data(), count, MPI_FLOAT, key.source.value(), tag(key), comm_, &request), "MPI_Irecv");
  const WaitStatus status = wait_for(request, deadline, &aborted_);
  if (status == WaitStatus::kOk) {
    out = std::move(into);
  } else {
    abandon_buffer(std::make_shared<Tensor>(std::move(into)));  // the receive stays posted
  }
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
  const int count = static_cast<int>(into.numel());
  if (packs(key)) {
    std::vector<std::uint16_t> packed(static_cast<std::size_t>(count));
    check_mpi(MPI_Recv(packed.data(), count, MPI_UINT16_T, key.source.value(), tag(key), comm_, MPI_STATUS_IGNORE),
              "MPI_Recv");
    unpack(packed, into);
  } else {
    check_mpi(MPI_Recv(into.data(), count, MPI_FLOAT, key.source.value(), tag(key), comm_, MPI_STATUS_IGNORE),
              "MPI_Recv");
  }
  out = std::move(into);
  return true;
}

WaitStatus MpiTransport::all_reduce_sum(RankId, double& value, Deadline deadline) {
  if (aborted()) return WaitStatus::kAborted;
  progress_sends();
  int size = 0;
  MPI_Comm_size(comm_, &size);
  // [this rank's value, every rank's]: one buffer to abandon if the gather never ends
  auto buffer = std::make_shared<std::vector<double>>(static_cast<std::size_t>(size) + 1);
  (*buffer)[0] = value;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(buffer->data(), 1, MPI_DOUBLE, buffer->data() + 1, 1, MPI_DOUBLE, comm_, &request),
            "MPI_Iallgather");
  const WaitStatus status = wait_for(request, deadline);
  if (status != WaitStatus::kOk) {  // the caller fails the step, and the job ends
    abandon_buffer(std::move(buffer));
    return status;
  }
  double sum = 0;
  for (std::size_t r = 1; r < buffer->size(); ++r) sum += (*buffer)[r];
  value = sum;
  return WaitStatus::kOk;
}

WaitStatus MpiTransport::complete_sends(RankId, Deadline deadline) {
  for (;;) {
    progress_sends();
    if (sends_.empty()) return WaitStatus::kOk;
    if (aborted()) return WaitStatus::kAborted;
    if (Clock::now() > deadline) return WaitStatus::kTimedOut;
    std::this_thread::yield();
  }
}

void MpiTransport::reset() {
  progress_sends();
  abandon_sends();
  aborted_.store(false, std::memory_order_release);
}

}  // namespace pipeflow::runtime
