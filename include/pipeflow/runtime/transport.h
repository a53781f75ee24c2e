#pragma once

#include <chrono>
#include <string>

#include "pipeflow/core/ids.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::runtime {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// `timeout` from now.
inline Deadline deadline_after(std::chrono::duration<double> timeout) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
}

// What a message carries between two pipeline ranks.
//   kActivation:   a stage's forward output, to the next stage (SEND_F/RECV_F);
//   kGradient:     a stage's input gradient, to the previous stage (SEND_B/RECV_B);
//   kTiedGradient: a copy of the tied wte gradient, between the stage holding
//                  the embedding and the one holding the LM head, after the
//                  flush (DeepSpeed's ReduceTiedGrads).
// kSampledTokens: generate's tokens from the last stage back to the first
// (ids carried as floats, exact: never narrowed to a 16-bit wire format).
enum class Direction { kActivation, kGradient, kTiedGradient, kSampledTokens };

const char* to_string(Direction direction);  // "activation", "gradient", "tied gradient", "sampled tokens"

// Names one message of a step: who sends it to whom, and what it is. `stage`
// is the sending stage. A key is sent at most once per step.
struct MessageKey {
  RankId source;
  RankId destination;
  StageId stage;
  MicrobatchId microbatch;
  Direction direction = Direction::kActivation;

  bool operator==(const MessageKey&) const = default;
};

// "activation of micro-batch 3 from stage 0 (rank 0 -> rank 1)".
std::string describe(const MessageKey& key);

// The tag a message travels under between processes (MpiTransport): one
// per direction, sending stage and micro-batch of a step, so that two
// messages between the same ranks never match each other's receive;
// 0 .. message_tags(num_stages, num_microbatches) - 1.
int message_tag(const MessageKey& key, int num_stages, int num_microbatches);
std::int64_t message_tags(int num_stages, int num_microbatches);

// How a blocking transport call ended. kAborted: abort() was called (another
// worker failed); the caller stops without an error of its own.
enum class WaitStatus { kOk, kTimedOut, kAborted };

// Moves tensors between pipeline ranks, with the semantics of MPI's
// non-blocking point-to-point calls so that both the in-process transport
// and an MPI one fit behind it:
//   send    ~ MPI_Isend: returns as soon as the message is posted; the
//             transport owns the payload until the receiver has it. It waits
//             (until `deadline`) only when the destination's buffer of
//             posted messages is full.
//   receive ~ MPI_Irecv + MPI_Wait: blocks until the message with exactly
//             this key has arrived. `shape` and `allocator` say what the
//             receiver expects, for a transport that must allocate the
//             receive buffer; the in-process transport hands over the
//             sender's tensor itself (no copy) and ignores them.
//   try_receive ~ MPI_Iprobe + MPI_Recv: the message if it has arrived,
//             else nothing (`shape` and `allocator` as for receive).
//   all_reduce_sum ~ MPI_Allreduce(MPI_SUM) of one double over all ranks,
//             summed in rank order (0 + v0 + v1 + ...) so every layout and
//             every rerun gets the same bits.
//   complete_sends ~ MPI_Waitall over the rank's sends.
// Messages may arrive in any order; receives match by key.
//
// Every blocking call takes a deadline and returns kTimedOut when it passes,
// so no wait is unbounded; abort() makes every blocked and every later call
// return kAborted until reset().
//
// Thread safety: every method may be called from any thread; each rank calls
// with its own RankId from one thread at a time.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual WaitStatus send(const MessageKey& key, Tensor payload, Deadline deadline) = 0;
  virtual WaitStatus receive(const MessageKey& key, const Shape& shape, Allocator allocator, Deadline deadline,
                             Tensor& out) = 0;
  virtual bool try_receive(const MessageKey& key, const Shape& shape, Allocator allocator, Tensor& out) = 0;
  virtual WaitStatus all_reduce_sum(RankId rank, double& value, Deadline deadline) = 0;
  // Waits until every message `rank` sent has left it (MPI: its sends
  // completed), so a step ends with nothing of its own in flight.
  virtual WaitStatus complete_sends(RankId rank, Deadline deadline) = 0;

  // Wakes every waiter with kAborted; later calls return kAborted at once.
  virtual void abort() = 0;
  virtual bool aborted() const = 0;
  // Drops every undelivered message and clears the aborted state (between steps).
  virtual void reset() = 0;
};

}  // namespace pipeflow::runtime
