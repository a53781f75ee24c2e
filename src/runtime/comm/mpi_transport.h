#pragma once

#include <mpi.h>

#include <atomic>
#include <vector>

#include "pipeflow/runtime/transport.h"
#include "pipeflow/tensor/half.h"

namespace pipeflow::runtime {

// The transport between pipeline ranks in different processes: each message
// is one MPI_Isend / MPI_Irecv of float32 on the pipeline's communicator
// (MpiGroups::pipeline(), whose rank r is pipeline rank r), with the tag
//   (direction · S + stage) · M + micro-batch     (S stages, M micro-batches)
// so that the key's source and tag name exactly one message of a step.
//
// Progress: by polling, on the worker's own thread. A send is posted and
// returns; the transport keeps the payload until MPI says it went, testing
// the pending sends at every later call. A receive is posted when its RECV
// runs and tested until it completes. No communication thread: on shared
// memory OpenMPI moves small messages eagerly, and the one large message a
// rank waits for is the one it polls (docs/RUNTIME.md, MPI: measured).
//
// In bf16 or fp16 (the wire format) activations and their gradients, whose
// every value is one of the format's, travel as its 16-bit patterns: half
// the bytes, and the same values.
//
// all_reduce_sum gathers every rank's value (MPI_Iallgather) and adds them in
// rank order, as the in-process transport does: the same bits in every
// layout.
//
// Thread safety: one rank per process, called by one thread at a time
// (MPI_THREAD_SERIALIZED).
class MpiTransport final : public Transport {
 public:
  // `pipeline`: the communicator; `self`: this process's pipeline rank.
  // Error when the largest tag exceeds the library's MPI_TAG_UB.
  MpiTransport(MPI_Comm pipeline, RankId self, int num_stages, int num_microbatches,
               ComputeFormat wire = ComputeFormat::kFp32);
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  WaitStatus send(const MessageKey& key, Tensor payload, Deadline deadline) override;
  WaitStatus receive(const MessageKey& key, const Shape& shape, Allocator allocator, Deadline deadline,
                     Tensor& out) override;
  bool try_receive(const MessageKey& key, const Shape& shape, Allocator allocator, Tensor& out) override;
  WaitStatus all_reduce_sum(RankId rank, double& value, Deadline deadline) override;
  WaitStatus complete_sends(RankId rank, Deadline deadline) override;
  void abort() override { aborted_.store(true, std::memory_order_release); }
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }
  // Clears the aborted state. Sends still in flight (only after a failed
  // step: complete_sends ends every good one) are abandoned with their
  // buffers (abandon_buffer): the job is ending.
  void reset() override;

  int tag(const MessageKey& key) const;
  // The messages sent and not yet completed, as describe() names them.
  std::vector<std::string> sends_in_flight() const;

 private:
  struct PendingSend {
    MessageKey key;
    MPI_Request request = MPI_REQUEST_NULL;
    Tensor payload;
    std::shared_ptr<std::vector<std::uint16_t>> packed;  // the payload in the wire format, when packed
  };
  // Whether the message travels in the 16-bit wire format: activations and
  // their gradients (values of the format already), not the fp32 tied
  // gradient or token ids.
  bool packs(const MessageKey& key) const {
    return wire_ != ComputeFormat::kFp32 &&
           (key.direction == Direction::kActivation || key.direction == Direction::kGradient);
  }
  void abandon_sends();
  // Tests every pending send and drops those done.
  void progress_sends();
  void check_count(const MessageKey& key, const MPI_Status& status, std::int64_t expected) const;
  // The received 16-bit patterns as the floats they stand for.
  void unpack(const std::vector<std::uint16_t>& packed, Tensor& into) const;

  MPI_Comm comm_;
  RankId self_;
  int num_stages_;
  int num_microbatches_;
  ComputeFormat wire_;
  std::vector<PendingSend> sends_;
  std::atomic<bool> aborted_{false};
};

}  // namespace pipeflow::runtime
