#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <set>
#include <thread>

#include "pipeflow/runtime/in_process_transport.h"

// Counts every allocation of this test binary while `counting` is set, to
// show that the transport allocates nothing per message.
namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
}  // namespace

// Out of line, so that the compiler does not pair an inlined delete's free()
// with a new it cannot see is malloc (-Wmismatched-new-delete).
[[gnu::noinline]] void* operator new(std::size_t bytes) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
// The nothrow form too (std::stable_sort's temporary buffer uses it): left to
// the sanitizer's, it would pair its allocator with the free() below.
[[gnu::noinline]] void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(bytes == 0 ? 1 : bytes);
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace pipeflow::runtime {
namespace {

using namespace std::chrono_literals;

MessageKey key(int from, int to, int stage, int microbatch, Direction direction = Direction::kActivation) {
  return {RankId(from), RankId(to), StageId(stage), MicrobatchId(microbatch), direction};
}

Deadline in(std::chrono::milliseconds ms) { return Clock::now() + ms; }

Tensor filled(float value, BufferPool* pool = nullptr) {
  Tensor t = Tensor::uninitialized({4, 8}, {pool, nullptr});
  for (float& x : t.span()) x = value;
  return t;
}

// Every message of a step between processes has a tag of its own (direction,
// sending stage and micro-batch all count), within the range the MPI
// transport checks against the library's largest tag.
TEST(MessageTags, EveryMessageOfAStepHasItsOwnTagInRange) {
  constexpr int kStages = 5, kMicrobatches = 7;
  std::set<int> seen;
  for (Direction direction :
       {Direction::kActivation, Direction::kGradient, Direction::kTiedGradient, Direction::kSampledTokens}) {
    for (int s = 0; s < kStages; ++s) {
      for (int j = 0; j < kMicrobatches; ++j) {
        const MessageKey key{RankId(0), RankId(1), StageId(s), MicrobatchId(j), direction};
        const int tag = message_tag(key, kStages, kMicrobatches);
        EXPECT_TRUE(seen.insert(tag).second) << describe(key) << " shares tag " << tag;
        EXPECT_GE(tag, 0);
        EXPECT_LT(tag, message_tags(kStages, kMicrobatches));
      }
    }
  }
  EXPECT_EQ(static_cast<std::int64_t>(seen.size()), message_tags(kStages, kMicrobatches));
}

TEST(InProcessTransport, ReceivesMatchByKeyInAnyOrder) {
  InProcessTransport transport({1, 4});
  ASSERT_EQ(transport.send(key(0, 1, 0, 0), filled(1), in(1s)), WaitStatus::kOk);
  ASSERT_EQ(transport.send(key(0, 1, 0, 1), filled(2), in(1s)), WaitStatus::kOk);
  ASSERT_EQ(transport.send(key(0, 1, 0, 0, Direction::kGradient), filled(3), in(1s)), WaitStatus::kOk);
  EXPECT_EQ(transport.pending(RankId(1)), 3);
  Tensor out;
  ASSERT_EQ(transport.receive(key(0, 1, 0, 1), {4, 8}, {}, in(1s), out), WaitStatus::kOk);
  EXPECT_EQ(out[5], 2.0f);
  ASSERT_TRUE(transport.try_receive(key(0, 1, 0, 0, Direction::kGradient), {}, {}, out));
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_FALSE(transport.try_receive(key(0, 1, 0, 3), {}, {}, out));
  ASSERT_EQ(transport.receive(key(0, 1, 0, 0), {4, 8}, {}, in(1s), out), WaitStatus::kOk);
  EXPECT_EQ(out[31], 1.0f);
  EXPECT_EQ(transport.pending(RankId(1)), 0);
}

TEST(InProcessTransport, TheTensorItselfTravels) {
  InProcessTransport transport({1, 1});
  Tensor sent = filled(7);
  const float* storage = sent.data();
  ASSERT_EQ(transport.send(key(0, 1, 0, 0), std::move(sent), in(1s)), WaitStatus::kOk);
  Tensor received;
  ASSERT_EQ(transport.receive(key(0, 1, 0, 0), {4, 8}, {}, in(1s), received), WaitStatus::kOk);
  EXPECT_EQ(received.data(), storage);
}

TEST(InProcessTransport, ReceiveTimesOutAndAFullInboxMakesSendWait) {
  InProcessTransport transport({1, 1});
  Tensor out;
  EXPECT_EQ(transport.receive(key(0, 1, 0, 0), {4, 8}, {}, in(20ms), out), WaitStatus::kTimedOut);
  ASSERT_EQ(transport.send(key(0, 1, 0, 0), filled(1), in(1s)), WaitStatus::kOk);
  EXPECT_EQ(transport.send(key(0, 1, 0, 1), filled(2), in(20ms)), WaitStatus::kTimedOut);
  // Once the receiver takes the first message the waiting send gets the slot.
  std::thread receiver([&] {
    std::this_thread::sleep_for(30ms);
    Tensor first;
    EXPECT_EQ(transport.receive(key(0, 1, 0, 0), {4, 8}, {}, in(5s), first), WaitStatus::kOk);
  });
  EXPECT_EQ(transport.send(key(0, 1, 0, 1), filled(2), in(5s)), WaitStatus::kOk);
  receiver.join();
  ASSERT_TRUE(transport.try_receive(key(0, 1, 0, 1), {}, {}, out));
  EXPECT_EQ(out[0], 2.0f);
}

// The engine's waits poll for kHandoffSpin before they sleep (pause, then
// yield, then asleep): a message is taken whichever phase it comes in, a
// deadline inside the spin still ends the wait, and abort ends a spinning
// one.
TEST(InProcessTransport, ASpinningWaitTakesAMessageInEveryPhaseKeepsItsDeadlineAndEndsOnAbort) {
  static_assert(kHandoffPauseSpin < std::chrono::microseconds(300) && kHandoffSpin > std::chrono::microseconds(300));
  InProcessTransport transport({1, 1}, kHandoffSpin);
  Tensor out;
  EXPECT_EQ(transport.receive(key(0, 1, 0, 0), {4, 8}, {}, Clock::now() + 100us, out), WaitStatus::kTimedOut);
  // At once (while it pauses), after 300 µs (while it yields), after 20 ms (asleep).
  const std::chrono::microseconds delays[] = {0us, 300us, 20000us};
  for (int j = 0; j < 3; ++j) {
    std::thread sender([&, j] {
      std::this_thread::sleep_for(delays[j]);
      EXPECT_EQ(transport.send(key(0, 1, 0, j), filled(static_cast<float>(j + 1)), in(5s)), WaitStatus::kOk);
    });
    EXPECT_EQ(transport.receive(key(0, 1, 0, j), {4, 8}, {}, in(5s), out), WaitStatus::kOk);
    EXPECT_EQ(out[0], static_cast<float>(j + 1));
    sender.join();
  }
  std::thread aborter([&] {
    std::this_thread::sleep_for(300us);
    transport.abort();
  });
  EXPECT_EQ(transport.receive(key(0, 1, 0, 3), {4, 8}, {}, in(30s), out), WaitStatus::kAborted);
  aborter.join();
}

TEST(InProcessTransport, AbortWakesEveryWaiterUntilReset) {
  InProcessTransport transport({1, 1, 1});
  std::atomic<int> aborted{0};
  std::thread receiver([&] {
    Tensor out;
    if (transport.receive(key(0, 1, 0, 0), {4, 8}, {}, in(30s), out) == WaitStatus::kAborted) ++aborted;
  });
  std::thread reducer([&] {
    double value = 1;
    if (transport.all_reduce_sum(RankId(2), value, in(30s)) == WaitStatus::kAborted) ++aborted;
  });
  std::this_thread::sleep_for(20ms);
  transport.abort();
  receiver.join();
  reducer.join();
  EXPECT_EQ(aborted.load(), 2);
  EXPECT_TRUE(transport.aborted());
  EXPECT_EQ(transport.send(key(0, 1, 0, 0), filled(1), in(1s)), WaitStatus::kAborted);
  transport.reset();
  EXPECT_FALSE(transport.aborted());
  EXPECT_EQ(transport.send(key(0, 1, 0, 0), filled(1), in(1s)), WaitStatus::kOk);
}

TEST(InProcessTransport, AllReduceSumsInRankOrderForEveryRank) {
  // In rank order ((0 + 1e16) - 1e16) + 1 + 0.25 = 1.25 exactly; the ranks
  // arrive in reverse, and summed in that order the 1.25 would be lost.
  const double values[] = {1e16, -1e16, 1.0, 0.25};
  InProcessTransport transport({1, 1, 1, 1});
  double results[4] = {};
  std::vector<std::thread> threads;
  for (int r = 3; r >= 0; --r) {
    threads.emplace_back([&, r] {
      results[r] = values[r];
      EXPECT_EQ(transport.all_reduce_sum(RankId(r), results[r], in(5s)), WaitStatus::kOk);
    });
  }
  for (auto& t : threads) t.join();
  for (const double r : results) EXPECT_EQ(r, 1.25);
}

TEST(InProcessTransport, AllReduceTimesOutWithoutEveryRankAndWithdrawsTheLateArrival) {
  InProcessTransport transport({1, 1});
  double alone = 5;
  EXPECT_EQ(transport.all_reduce_sum(RankId(0), alone, in(20ms)), WaitStatus::kTimedOut);
  EXPECT_EQ(alone, 5.0);
  // The timed-out rank 0 is no longer counted: the next round needs both
  // ranks again and sums only their new values.
  double values[2] = {1, 2};
  std::thread other([&] { EXPECT_EQ(transport.all_reduce_sum(RankId(1), values[1], in(5s)), WaitStatus::kOk); });
  EXPECT_EQ(transport.all_reduce_sum(RankId(0), values[0], in(5s)), WaitStatus::kOk);
  other.join();
  EXPECT_EQ(values[0], 3.0);
  EXPECT_EQ(values[1], 3.0);
}

// Rank 0 sends a buffer from `pool`, rank 1 sends it back, `rounds` times;
// allocations are counted on rank 0 between its first send and its last
// receive (the peer thread is started before).
void ping_pong(InProcessTransport& transport, BufferPool& pool, int rounds, bool count) {
  std::thread peer([&] {
    for (int round = 0; round < rounds; ++round) {
      Tensor in_flight;
      EXPECT_EQ(transport.receive(key(0, 1, 0, round), {4, 8}, {}, in(5s), in_flight), WaitStatus::kOk);
      EXPECT_EQ(transport.send(key(1, 0, 1, round, Direction::kGradient), std::move(in_flight), in(5s)),
                WaitStatus::kOk);
    }
  });
  counting.store(count);
  for (int round = 0; round < rounds; ++round) {
    EXPECT_EQ(transport.send(key(0, 1, 0, round), filled(1, &pool), in(5s)), WaitStatus::kOk);
    Tensor back;
    EXPECT_EQ(transport.receive(key(1, 0, 1, round, Direction::kGradient), {4, 8}, {}, in(5s), back),
              WaitStatus::kOk);
  }
  counting.store(false);
  peer.join();
}

TEST(InProcessTransport, SteadyStateMessagesAllocateNothing) {
  BufferPool pool;
  InProcessTransport transport({4, 4});
  ping_pong(transport, pool, 1, false);  // warm-up: the pool gets its block
  const std::int64_t blocks = pool.system_allocations();
  ping_pong(transport, pool, 200, true);
  EXPECT_EQ(allocations.load(), 0);
  EXPECT_EQ(pool.system_allocations(), blocks);
}

TEST(MessageKey, DescribesWhatItCarries) {
  EXPECT_EQ(describe(key(0, 1, 0, 3)), "activation of micro-batch 3 from stage 0 (rank 0 -> rank 1)");
  EXPECT_EQ(describe(key(2, 1, 2, 0, Direction::kGradient)), "gradient of micro-batch 0 from stage 2 (rank 2 -> rank 1)");
  EXPECT_EQ(describe(key(1, 0, 5, 0, Direction::kTiedGradient)), "tied wte gradient of stage 5 (rank 1 -> rank 0)");
}

}  // namespace
}  // namespace pipeflow::runtime
