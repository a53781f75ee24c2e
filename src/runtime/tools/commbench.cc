#include "pipeflow/runtime/commbench.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <span>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/table.h"
#include "pipeflow/core/units.h"
#include "comm/mpi.h"
#include "pipeflow/config/run_config.h"
#include "pipeflow/runtime/rank_group.h"
#include "pipeflow/tensor/buffer_pool.h"
#include "engine/tensor_collectives.h"

namespace pipeflow::runtime {
namespace {

constexpr std::int64_t kLargestMessage = std::int64_t{1} << 30;
constexpr double kGB = 1e9;  // nccl-tests' GB/s

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The value of element i in round `round` of a test (`salt`): small whole
// numbers, exact in float, different from round to round so that a stale
// buffer counts as wrong.
float pattern(std::int64_t i, int round, int salt) {
  return static_cast<float>((i * 7 + std::int64_t{round} * 13 + salt) % 4093);
}

void fill(std::span<float> values, int round, int salt) {
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = pattern(static_cast<std::int64_t>(i), round, salt);
}

std::int64_t count_wrong(std::span<const float> values, int round, int salt) {
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    wrong += values[i] != pattern(static_cast<std::int64_t>(i), round, salt) ? 1 : 0;
  }
  return wrong;
}

constexpr int kP2pSalt = 1;
constexpr int kBaselineSalt = 2;

// A ping-pong's figures for one size, at the pinging end.
struct PingPongTimes {
  double p2p_s = 0;
  double baseline_s = 0;
  std::int64_t p2p_wrong = 0;
  std::int64_t baseline_wrong = 0;
};

// One end of the link r <-> r + 1 during its phase. The pinger (r) sends a
// patterned message and times until the echo is back; the ponger (r + 1)
// returns what it received; the pinger checks the echo, so a wrong element
// on either leg counts. Each round runs p2p then baseline.
class PingPong {
 public:
  PingPong(RankGroup& group, int self, int peer, int processes, const CommbenchOptions& options)
      : comm_(MPI_COMM_WORLD),
        self_(self),
        peer_(peer),
        pinger_(self < peer),
        baseline_tag_(0),  // MPI_COMM_WORLD's, apart from the transport's communicator
        go_tag_(1),
        options_(options),
        transport_(group.pipeline_transport(
            0, 0, {.inbox_capacity = std::vector<int>(static_cast<std::size_t>(processes), 1),
                .stages = processes,
                .microbatches = 1})) {}
  PingPong(const PingPong&) = delete;
  PingPong& operator=(const PingPong&) = delete;

  PingPongTimes measure(std::int64_t bytes) {
    const std::int64_t floats = bytes / static_cast<std::int64_t>(sizeof(float));
    baseline_send_.resize(static_cast<std::size_t>(floats));
    baseline_receive_.resize(static_cast<std::size_t>(floats));
    PingPongTimes times;
    for (int round = 0; round < options_.warmup + options_.iters; ++round) {
      const bool timed = round >= options_.warmup;
      const double p2p = p2p_round(floats, round, timed ? &times.p2p_wrong : nullptr);
      const double baseline = baseline_round(floats, round, timed ? &times.baseline_wrong : nullptr);
      if (timed) {
        times.p2p_s += p2p / 2;
        times.baseline_s += baseline / 2;
      }
    }
    times.p2p_s /= options_.iters;
    times.baseline_s /= options_.iters;
    return times;
  }

 private:
  MessageKey key(bool forward) const {
    const int source = forward == pinger_ ? self_ : peer_;
    const int destination = forward == pinger_ ? peer_ : self_;
    return MessageKey{.source = RankId(source),
                      .destination = RankId(destination),
                      .stage = StageId(source),
                      .microbatch = MicrobatchId(0),
                      .direction = forward ? Direction::kActivation : Direction::kGradient};
  }

  // Before a timed leg: the pinger has filled its message (milliseconds for
  // large ones) and says go; the ponger, in a blocking receive meanwhile,
  // posts its receive right after. Without it the ponger's receive would
  // have waited past wait_for's millisecond of spinning and would notice
  // the message only after a sleep: a cost of the fill, not of the link.
  void go() {
    if (pinger_) {
      check_mpi(MPI_Send(nullptr, 0, MPI_BYTE, peer_, go_tag_, comm_), "MPI_Send");
    } else {
      check_mpi(MPI_Recv(nullptr, 0, MPI_BYTE, peer_, go_tag_, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
    }
  }

  void check(WaitStatus status, std::int64_t floats) const {
    if (status == WaitStatus::kOk) return;
    fail("commbench p2p: rank {} got no message of {} from rank {} within {:.0f} s (the peer is stuck or gone; "
         "raise --timeout if it is only slow)",
         self_, format_bytes(static_cast<double>(floats) * sizeof(float)), peer_, options_.timeout.count());
  }

  // The round trip's seconds at the pinger (0 at the ponger).
  double p2p_round(std::int64_t floats, int round, std::int64_t* wrong) {
    const Shape shape{floats};
    const Allocator allocator{.pool = &pool_};
    const Deadline deadline = deadline_after(options_.timeout);
    Tensor received;
    if (!pinger_) {
      go();
      check(transport_->receive(key(true), shape, allocator, deadline, received), floats);
      check(transport_->send(key(false), std::move(received), deadline), floats);
      check(transport_->complete_sends(RankId(self_), deadline), floats);  // nothing left in flight between rounds
      return 0;
    }
    Tensor message = Tensor::uninitialized(shape, allocator);
    fill(message.span(), round, kP2pSalt);
    go();
    const Clock::time_point start = Clock::now();
    check(transport_->send(key(true), std::move(message), deadline), floats);
    check(transport_->receive(key(false), shape, allocator, deadline, received), floats);
    const double trip = seconds_since(start);
    check(transport_->complete_sends(RankId(self_), deadline), floats);
    if (wrong != nullptr) *wrong += count_wrong(received.span(), round, kP2pSalt);
    return trip;
  }

  double baseline_round(std::int64_t floats, int round, std::int64_t* wrong) {
    const int count = static_cast<int>(floats);
    if (!pinger_) {
      go();
      check_mpi(MPI_Recv(baseline_receive_.data(), count, MPI_FLOAT, peer_, baseline_tag_, comm_, MPI_STATUS_IGNORE),
                "MPI_Recv");
      check_mpi(MPI_Send(baseline_receive_.data(), count, MPI_FLOAT, peer_, baseline_tag_, comm_), "MPI_Send");
      return 0;
    }
    fill(baseline_send_, round, kBaselineSalt);
    go();
    const Clock::time_point start = Clock::now();
    check_mpi(MPI_Send(baseline_send_.data(), count, MPI_FLOAT, peer_, baseline_tag_, comm_), "MPI_Send");
    check_mpi(MPI_Recv(baseline_receive_.data(), count, MPI_FLOAT, peer_, baseline_tag_, comm_, MPI_STATUS_IGNORE),
              "MPI_Recv");
    const double trip = seconds_since(start);
    if (wrong != nullptr) *wrong += count_wrong(baseline_receive_, round, kBaselineSalt);
    return trip;
  }

  MPI_Comm comm_;
  int self_;
  int peer_;
  bool pinger_;
  int baseline_tag_;
  int go_tag_;
  const CommbenchOptions& options_;
  BufferPool pool_;  // before the transport: its pending sends hold the pool's tensors until it is destroyed
  std::unique_ptr<Transport> transport_;
  std::vector<float> baseline_send_;
  std::vector<float> baseline_receive_;
};

// All-reduce: rank r's element i in round k is (3i + 5r + k) mod 127, so the
// sum is a whole number far below 2^24, exact in float whatever the order.
float all_reduce_term(std::int64_t i, int rank, int round) {
  return static_cast<float>((i * 3 + std::int64_t{rank} * 5 + round) % 127);
}

struct AllReduceTimes {
  double time_s = 0;
  std::int64_t wrong = 0;
};

AllReduceTimes measure_all_reduce(Communicator& world, int rank, int processes, std::int64_t bytes,
                                  const CommbenchOptions& options, std::vector<float>& buffer) {
  const auto floats = static_cast<std::size_t>(bytes / static_cast<std::int64_t>(sizeof(float)));
  buffer.resize(floats);
  const std::string what = fmt::format("the commbench all-reduce of {}", format_bytes(static_cast<double>(bytes)));
  AllReduceTimes times;
  for (int round = 0; round < options.warmup + options.iters; ++round) {
    for (std::size_t i = 0; i < floats; ++i) buffer[i] = all_reduce_term(static_cast<std::int64_t>(i), rank, round);
    const Clock::time_point start = Clock::now();
    world.all_reduce_sum(buffer, deadline_after(options.timeout), what, static_cast<std::size_t>(kReduceBucketSize));
    const double seconds = seconds_since(start);
    if (round < options.warmup) continue;
    times.time_s += seconds;
    for (std::size_t i = 0; i < floats; ++i) {
      float expected = 0;
      for (int r = 0; r < processes; ++r) expected += all_reduce_term(static_cast<std::int64_t>(i), r, round);
      times.wrong += buffer[i] != expected ? 1 : 0;
    }
  }
  times.time_s /= options.iters;
  return times;
}

// The tensor-parallel collectives at `floats` floats, over `collectives`'
// group: the all-reduce's and the all-gather's mean round and wrong elements.
struct TensorTimes {
  AllReduceTimes all_reduce, all_gather;
};

TensorTimes measure_tensor(TensorCollectives& collectives, std::int64_t floats, const CommbenchOptions& options) {
  const int members = collectives.size();
  const int member = collectives.rank();
  const auto n = static_cast<std::size_t>(floats);
  const std::size_t part = n / static_cast<std::size_t>(members);
  std::vector<float> buffer(n);
  std::vector<float> gathered(n);
  const std::string what = fmt::format("the commbench tensor-parallel collectives of {}",
                                       format_bytes(static_cast<double>(floats) * sizeof(float)));
  TensorTimes times;
  for (int round = 0; round < options.warmup + options.iters; ++round) {
    for (std::size_t i = 0; i < n; ++i) buffer[i] = all_reduce_term(static_cast<std::int64_t>(i), member, round);
    Clock::time_point start = Clock::now();
    collectives.all_reduce_sum(buffer, what);
    const double reduce_s = seconds_since(start);
    std::vector<float> mine(part);
    for (std::size_t i = 0; i < part; ++i) mine[i] = all_reduce_term(static_cast<std::int64_t>(i), member, round);
    start = Clock::now();
    collectives.all_gather(mine, gathered, what);
    const double gather_s = seconds_since(start);
    if (round < options.warmup) continue;
    times.all_reduce.time_s += reduce_s;
    times.all_gather.time_s += gather_s;
    for (std::size_t i = 0; i < n; ++i) {
      float expected = 0;
      for (int r = 0; r < members; ++r) expected += all_reduce_term(static_cast<std::int64_t>(i), r, round);
      times.all_reduce.wrong += buffer[i] != expected ? 1 : 0;
      const auto k = static_cast<int>(i / part);
      times.all_gather.wrong +=
          gathered[i] != all_reduce_term(static_cast<std::int64_t>(i % part), k, round) ? 1 : 0;
    }
  }
  times.all_reduce.time_s /= options.iters;
  times.all_gather.time_s /= options.iters;
  (void)collectives.take(Clock::now());
  return times;
}

bool is_power_of_two(std::int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

std::string gbps(double bytes_per_s) { return fmt::format("{:.2f}", bytes_per_s / kGB); }
std::string microseconds(double seconds) { return fmt::format("{:.2f}", seconds * 1e6); }

nlohmann::ordered_json rows_json(const std::vector<CommRow>& rows) {
  nlohmann::ordered_json json = nlohmann::ordered_json::array();
  for (const CommRow& row : rows) {
    json.push_back({{"bytes", row.bytes},
                    {"time_us", row.time_s * 1e6},
                    {"algbw_GBps", row.algbw_bytes_per_s / kGB},
                    {"busbw_GBps", row.busbw_bytes_per_s / kGB},
                    {"wrong_elements", row.wrong_elements}});
  }
  return json;
}

// The slowest link of one kind per size: empty when no link is of that kind.
std::vector<double> slowest_links(const CommbenchResult& result, bool intra_node) {
  std::vector<double> slowest;
  for (const LinkTimes& link : result.links) {
    if (link.intra_node != intra_node) continue;
    if (slowest.empty()) slowest.assign(link.one_way_s.size(), 0.0);
    for (std::size_t s = 0; s < slowest.size(); ++s) slowest[s] = std::max(slowest[s], link.one_way_s[s]);
  }
  return slowest;
}

}  // namespace

void validate_commbench_options(const CommbenchOptions& options) {
  for (const auto& [option, bytes] :
       {std::pair{"--min-bytes", options.min_bytes}, std::pair{"--max-bytes", options.max_bytes}}) {
    if (!is_power_of_two(bytes) || bytes < 4 || bytes > kLargestMessage) {
      fail("{} {}: must be a power of two from 4 bytes (one float) to 1G, e.g. 1K or 64M", option, bytes);
    }
  }
  if (options.min_bytes > options.max_bytes) {
    fail("--min-bytes {} exceeds --max-bytes {}: give min <= max", options.min_bytes, options.max_bytes);
  }
  // Rounds are counted in int: warmup + iters must not overflow (2^31 - 1 reported inf GB/s).
  constexpr int kMaxRounds = 1'000'000;
  if (options.iters < 1 || options.iters > kMaxRounds) {
    fail("--iters {}: must be 1 to {} timed rounds", options.iters, kMaxRounds);
  }
  if (options.warmup < 0 || options.warmup > kMaxRounds) fail("--warmup {}: must be 0 to {}", options.warmup, kMaxRounds);
  if (!(options.timeout.count() > 0)) fail("--timeout {}: must be > 0 seconds", options.timeout.count());
  if (options.tensor_parallel == 0) return;
  if (options.tensor_parallel < 2) fail("--tp {}: the tensor-parallel test needs groups of at least 2", options.tensor_parallel);
  for (const auto& [b, t, c] : options.activations) {
    const std::int64_t floats = b * t * c;
    if (b < 1 || t < 1 || c < 1 || floats * 4 > kLargestMessage || floats % options.tensor_parallel != 0) {
      fail("--activation {},{},{}: b, t and c must be positive, b·t·c floats at most 1G bytes and a multiple of "
           "--tp {} (each member gathers an equal part)",
           b, t, c, options.tensor_parallel);
    }
  }
}

std::vector<std::int64_t> message_sizes(const CommbenchOptions& options) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) sizes.push_back(bytes);
  return sizes;
}

CommRow comm_row(std::int64_t bytes, double time_s, double bus_factor, std::int64_t wrong_elements) {
  const double algbw = static_cast<double>(bytes) / time_s;
  return CommRow{.bytes = bytes,
                 .time_s = time_s,
                 .algbw_bytes_per_s = algbw,
                 .busbw_bytes_per_s = algbw * bus_factor,
                 .wrong_elements = wrong_elements};
}

double all_reduce_bus_factor(int processes) { return 2.0 * (processes - 1) / processes; }

CommbenchResult run_commbench(const MpiWorld& world, const CommbenchOptions& options) {
  validate_commbench_options(options);
  const int processes = world.size();
  const int rank = world.rank();
  if (processes < 2) {
    fail("commbench measures the links between processes and mpirun started 1: run mpirun -np 2 (or more) "
         "pipeflow commbench");
  }
  // The transport and the all-reduce are the training runtime's, over MPI processes.
  const std::unique_ptr<RankGroup> group = RankGroup::in_processes(world, {.pipeline = processes, .data_parallel = 1});
  Communicator& comm = group->world(rank);
  const std::vector<std::int64_t> sizes = message_sizes(options);
  const std::size_t count = sizes.size();

  // Point-to-point, phase 0 the links from even ranks, phase 1 from odd ones.
  std::vector<PingPongTimes> pings(count);
  for (int phase = 0; phase < 2; ++phase) {
    int peer = -1;
    if (rank % 2 == phase && rank + 1 < processes) peer = rank + 1;
    if (rank >= 1 && (rank - 1) % 2 == phase) peer = rank - 1;
    if (peer >= 0) {
      PingPong ping_pong(*group, rank, peer, processes, options);
      for (std::size_t s = 0; s < count; ++s) {
        const PingPongTimes times = ping_pong.measure(sizes[s]);
        if (rank < peer) pings[s] = times;
      }
    }
    // Every process starts the next phase (or the all-reduce) together: one
    // idle in this phase would otherwise spend all of it in its next first
    // wait and could pass that wait's deadline. Blocking, as the baseline is.
    check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  }
  std::vector<AllReduceTimes> reduces(count);
  std::vector<float> buffer;
  for (std::size_t s = 0; s < count; ++s) {
    reduces[s] = measure_all_reduce(comm, rank, processes, sizes[s], options, buffer);
  }

  // The tensor-parallel collectives, over groups of consecutive processes.
  std::vector<TensorTimes> tensor;
  if (options.tensor_parallel > 0) {
    if (processes % options.tensor_parallel != 0) {
      fail("--tp {}: mpirun started {} processes, not a multiple of it: start mpirun -np {}", options.tensor_parallel,
           processes, options.tensor_parallel);
    }
    const std::unique_ptr<RankGroup> split = RankGroup::in_processes(
        world, {.pipeline = processes / options.tensor_parallel, .data_parallel = 1, .tensor = options.tensor_parallel});
    TensorCollectives collectives(split->tensor(rank), options.timeout);
    for (const auto& [b, t, c] : options.activations) tensor.push_back(measure_tensor(collectives, b * t * c, options));
  }

  // Every process's figures to every process: per size p2p, baseline,
  // their wrong elements, the all-reduce's time and wrong elements; then
  // the process's machine.
  constexpr std::size_t kFields = 6;
  std::vector<double> mine;
  for (std::size_t s = 0; s < count; ++s) {
    mine.insert(mine.end(), {pings[s].p2p_s, pings[s].baseline_s, static_cast<double>(pings[s].p2p_wrong),
                             static_cast<double>(pings[s].baseline_wrong), reduces[s].time_s,
                             static_cast<double>(reduces[s].wrong)});
  }
  for (const TensorTimes& t : tensor) {
    mine.insert(mine.end(), {t.all_reduce.time_s, static_cast<double>(t.all_reduce.wrong), t.all_gather.time_s,
                             static_cast<double>(t.all_gather.wrong)});
  }
  mine.push_back(world.first_rank_on_host());
  const std::size_t stride = mine.size();
  const std::vector<double> all =
      comm.all_gather(mine, deadline_after(options.timeout), "the commbench results");
  const auto field = [&](int r, std::size_t s, std::size_t f) {
    return all[static_cast<std::size_t>(r) * stride + s * kFields + f];
  };
  const auto host = [&](int r) { return all[static_cast<std::size_t>(r) * stride + stride - 1]; };

  CommbenchResult result;
  result.processes = processes;
  result.options = options;
  std::set<double> hosts;
  for (int r = 0; r < processes; ++r) hosts.insert(host(r));
  result.hosts = static_cast<int>(hosts.size());
  for (int r = 0; r + 1 < processes; ++r) {
    LinkTimes link{.rank = r, .intra_node = host(r) == host(r + 1), .one_way_s = {}};
    for (std::size_t s = 0; s < count; ++s) link.one_way_s.push_back(field(r, s, 0));
    result.links.push_back(std::move(link));
  }
  for (std::size_t s = 0; s < count; ++s) {
    double p2p = 0;
    double baseline = 0;
    double all_reduce = 0;
    std::int64_t p2p_wrong = 0;
    std::int64_t baseline_wrong = 0;
    std::int64_t all_reduce_wrong = 0;
    for (int r = 0; r < processes; ++r) {
      if (r + 1 < processes) {
        p2p = std::max(p2p, field(r, s, 0));
        baseline = std::max(baseline, field(r, s, 1));
        p2p_wrong += static_cast<std::int64_t>(field(r, s, 2));
        baseline_wrong += static_cast<std::int64_t>(field(r, s, 3));
      }
      all_reduce = std::max(all_reduce, field(r, s, 4));
      all_reduce_wrong += static_cast<std::int64_t>(field(r, s, 5));
    }
    result.p2p.push_back(comm_row(sizes[s], p2p, 1, p2p_wrong));
    result.baseline.push_back(comm_row(sizes[s], baseline, 1, baseline_wrong));
    result.all_reduce.push_back(
        comm_row(sizes[s], all_reduce, all_reduce_bus_factor(processes), all_reduce_wrong));
  }
  for (std::size_t a = 0; a < tensor.size(); ++a) {
    const std::size_t at = count * kFields + 4 * a;
    double reduce_s = 0, gather_s = 0;
    std::int64_t reduce_wrong = 0, gather_wrong = 0;
    for (int r = 0; r < processes; ++r) {
      const double* f = &all[static_cast<std::size_t>(r) * stride + at];
      reduce_s = std::max(reduce_s, f[0]);
      reduce_wrong += static_cast<std::int64_t>(f[1]);
      gather_s = std::max(gather_s, f[2]);
      gather_wrong += static_cast<std::int64_t>(f[3]);
    }
    const auto& [b, t, c] = options.activations[a];
    const std::int64_t bytes = b * t * c * static_cast<std::int64_t>(sizeof(float));
    const int n = options.tensor_parallel;
    result.tensor.push_back({.activation = options.activations[a],
                             .all_reduce = comm_row(bytes, reduce_s, all_reduce_bus_factor(n), reduce_wrong),
                             .all_gather = comm_row(bytes, gather_s, (n - 1.0) / n, gather_wrong)});
  }
  return result;
}

std::string commbench_text(const CommbenchResult& result) {
  std::string text = fmt::format(
      "pipeflow commbench: {} on {}, {} timed rounds per size after {} warm-up; GB/s = 1e9 bytes/s\n"
      "p2p: ping-pong between neighbouring pipeline ranks r <-> r+1 through pipeflow's MPI transport "
      "(MPI_Isend/MPI_Irecv, polled), time one way, busbw = algbw\n"
      "baseline: the same ping-pong with blocking MPI_Send/MPI_Recv, interleaved round by round\n"
      "all-reduce: a float sum over every process (reduce-scatter then all-gather in 16 MiB buckets, the "
      "data-parallel gradient path), busbw = algbw x 2(n-1)/n\n",
      format_count(result.processes, "process", "processes"), format_count(result.hosts, "host"),
      result.options.iters, result.options.warmup);
  TextTable table({"size", "p2p us", "p2p GB/s", "wrong", "baseline us", "baseline GB/s", "wrong", "p2p/baseline",
                   "all-reduce us", "algbw GB/s", "busbw GB/s", "wrong"});
  for (std::size_t s = 0; s < result.p2p.size(); ++s) {
    const CommRow& p2p = result.p2p[s];
    const CommRow& baseline = result.baseline[s];
    const CommRow& reduce = result.all_reduce[s];
    table.add_row({format_bytes(static_cast<double>(p2p.bytes)), microseconds(p2p.time_s),
                   gbps(p2p.algbw_bytes_per_s), std::to_string(p2p.wrong_elements), microseconds(baseline.time_s),
                   gbps(baseline.algbw_bytes_per_s), std::to_string(baseline.wrong_elements),
                   format_percent(p2p.algbw_bytes_per_s / baseline.algbw_bytes_per_s), microseconds(reduce.time_s),
                   gbps(reduce.algbw_bytes_per_s), gbps(reduce.busbw_bytes_per_s),
                   std::to_string(reduce.wrong_elements)});
  }
  text += table.render();
  if (result.tensor.empty()) return text;
  text += fmt::format(
      "\ntensor parallel: groups of {} consecutive processes, through the layers' collectives; per activation "
      "[b, t, c] of floats: the all-reduce that ends a row-parallel product (busbw = algbw x 2(n-1)/n) and the "
      "all-gather of the logits' columns (its bytes the gathered whole, busbw = algbw x (n-1)/n); the slowest "
      "process\n",
      result.options.tensor_parallel);
  TextTable tensor({"activation", "size", "all-reduce us", "algbw GB/s", "busbw GB/s", "wrong", "all-gather us",
                    "algbw GB/s", "busbw GB/s", "wrong"});
  for (const TensorRow& row : result.tensor) {
    tensor.add_row({fmt::format("[{}, {}, {}]", row.activation[0], row.activation[1], row.activation[2]),
                    format_bytes(static_cast<double>(row.all_reduce.bytes)), microseconds(row.all_reduce.time_s),
                    gbps(row.all_reduce.algbw_bytes_per_s), gbps(row.all_reduce.busbw_bytes_per_s),
                    std::to_string(row.all_reduce.wrong_elements), microseconds(row.all_gather.time_s),
                    gbps(row.all_gather.algbw_bytes_per_s), gbps(row.all_gather.busbw_bytes_per_s),
                    std::to_string(row.all_gather.wrong_elements)});
  }
  return text + tensor.render();
}

std::string commbench_json(const CommbenchResult& result) {
  nlohmann::ordered_json json;
  json["processes"] = result.processes;
  json["hosts"] = result.hosts;
  json["iters"] = result.options.iters;
  json["warmup"] = result.options.warmup;
  json["p2p"] = rows_json(result.p2p);
  json["all_reduce"] = rows_json(result.all_reduce);
  json["baseline"] = rows_json(result.baseline);
  if (!result.tensor.empty()) {
    json["tensor_parallel"] = result.options.tensor_parallel;
    json["tensor"] = nlohmann::ordered_json::array();
    for (const TensorRow& row : result.tensor) {
      json["tensor"].push_back({{"activation", row.activation},
                                {"all_reduce", rows_json({row.all_reduce}).front()},
                                {"all_gather", rows_json({row.all_gather}).front()}});
    }
  }
  return json_text(json, 2) + "\n";
}

HardwareProfile with_measured_links(HardwareProfile base, const CommbenchResult& result) {
  const std::vector<std::int64_t> sizes = message_sizes(result.options);
  if (sizes.size() < 2) {
    fail("--save-hardware fits latency and bandwidth through two message sizes and --min-bytes = --max-bytes = {} "
         "gives one: raise --max-bytes (e.g. 64M)",
         result.options.max_bytes);
  }
  struct Kind {
    bool intra_node;
    const char* name;
    double HardwareProfile::*latency;
    double HardwareProfile::*bandwidth;
    const char* latency_key;
    const char* bandwidth_key;
  };
  const Kind kinds[] = {
      {true, "intra-node", &HardwareProfile::intra_node_latency_s, &HardwareProfile::intra_node_bandwidth_bytes_per_s,
       "intra_node_latency_s", "intra_node_bandwidth_bytes_per_s"},
      {false, "inter-node", &HardwareProfile::inter_node_latency_s, &HardwareProfile::inter_node_bandwidth_bytes_per_s,
       "inter_node_latency_s", "inter_node_bandwidth_bytes_per_s"},
  };
  std::vector<std::string> measured;
  for (const Kind& kind : kinds) {
    const std::vector<double> slowest = slowest_links(result, kind.intra_node);
    if (slowest.empty()) continue;
    const double smallest = slowest.front();
    const double largest = slowest.back();
    if (!(largest > smallest)) {
      fail("--save-hardware: the {} link moved {} in {} and {} in {}: the largest message must take longer to fit a "
           "bandwidth; raise --max-bytes or --iters",
           kind.name, format_bytes(static_cast<double>(sizes.front())), format_seconds(smallest),
           format_bytes(static_cast<double>(sizes.back())), format_seconds(largest));
    }
    base.*kind.latency = smallest;
    base.*kind.bandwidth = static_cast<double>(sizes.back()) / (largest - smallest);
    std::erase_if(base.estimated, [&](const std::string& key) {
      return key == kind.latency_key || key == kind.bandwidth_key;
    });
    measured.push_back(fmt::format("{} {} and {}", kind.name, format_seconds(base.*kind.latency),
                                   format_si(base.*kind.bandwidth, "B/s")));
  }
  std::string figures;
  for (const std::string& m : measured) figures += (figures.empty() ? "" : "; ") + m;
  base.note = fmt::format(
      "{} with links measured by pipeflow commbench ({} on {}, {} to {} ping-pong through MpiTransport, the "
      "slowest link): {}",
      base.name, format_count(result.processes, "process", "processes"), format_count(result.hosts, "host"),
      format_bytes(static_cast<double>(sizes.front())), format_bytes(static_cast<double>(sizes.back())), figures);
  base.name += "-commbench";
  validate_hardware(base);
  return base;
}

}  // namespace pipeflow::runtime
