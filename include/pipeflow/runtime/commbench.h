#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "pipeflow/model/hardware.h"
#include "pipeflow/runtime/mpi_world.h"

namespace pipeflow::runtime {

// `pipeflow commbench`: the links between the processes of an MPI job,
// measured before training as nccl-tests measures NCCL's (and as a cluster
// checks its interconnect before a run).
//
// Three tests, each a row per message size (powers of two), and a fourth
// with tensor_parallel > 0:
//   p2p:        ping-pong between neighbouring pipeline ranks r <-> r + 1
//               through MpiTransport, the path pipeflow's training sends
//               activations and gradients on (MPI_Isend / MPI_Irecv polled
//               by wait_for, the receive buffer from a BufferPool);
//   baseline:   the same ping-pong with plain blocking MPI_Send / MPI_Recv,
//               interleaved with p2p round by round, so both meet the same
//               machine;
//   all_reduce: the sum of a float buffer over every process through
//               MpiGroups::all_reduce_sum, the path of the data-parallel
//               gradient all-reduce (16 MiB buckets);
//   tensor:     per activation [b, t, c] (a layer's output, float), over
//               each group of tensor_parallel consecutive processes
//               (Megatron-LM's order) through the layers' collectives
//               (TensorCollectives): the all-reduce that ends a row-parallel
//               product (b·t·c floats) and the all-gather of the logits'
//               columns (each member b·t·c / tensor_parallel floats).
// nccl-tests' figures: a point-to-point time is one way (half a round
// trip), algbw = bytes / time, busbw = algbw for point-to-point and
// algbw · 2(n − 1)/n for all-reduce (n processes); GB = 1e9 bytes. With
// more than 2 processes the links r <-> r + 1 are measured in two phases
// (even r, then odd r; a barrier after each), pairs of a phase at once, and
// a row holds the slowest link's time; an all-reduce row the slowest
// process's.
//
// Every round fills the sent buffers with a pattern of the size and the
// round and checks what came back (the echo, the sum), outside the timed
// region: a row counts its wrong elements, so a fast wrong answer shows.

struct CommbenchOptions {
  std::int64_t min_bytes = 1024;
  std::int64_t max_bytes = std::int64_t{64} << 20;
  int iters = 20;   // timed rounds per size
  int warmup = 5;   // untimed rounds before them
  std::chrono::duration<double> timeout{60};  // longest wait for a peer
  // The tensor-parallel test: the group size (0: not run) and the
  // activations [b, t, c] measured.
  int tensor_parallel = 0;
  std::vector<std::array<std::int64_t, 3>> activations = {{8, 64, 128}, {8, 64, 512}};
};

// Error naming the option unless both sizes are powers of two, whole floats
// (>= 4 bytes), min <= max <= 1 GiB, iters >= 1 and warmup >= 0, and with
// tensor_parallel > 0 it is at least 2 and each activation's b·t·c floats
// are positive, at most 1 GiB and a multiple of tensor_parallel.
void validate_commbench_options(const CommbenchOptions& options);

// The message sizes: min_bytes, 2·min_bytes, ..., max_bytes.
std::vector<std::int64_t> message_sizes(const CommbenchOptions& options);

// One row of nccl-tests' table.
struct CommRow {
  std::int64_t bytes = 0;
  double time_s = 0;
  double algbw_bytes_per_s = 0;
  double busbw_bytes_per_s = 0;
  std::int64_t wrong_elements = 0;
};

// A row with algbw = bytes / time and busbw = algbw · `bus_factor`.
CommRow comm_row(std::int64_t bytes, double time_s, double bus_factor, std::int64_t wrong_elements);
// nccl-tests' bus factor of an all-reduce over n processes: 2(n − 1)/n.
double all_reduce_bus_factor(int processes);

// One link r <-> r + 1: its one-way p2p time per size (message_sizes order).
struct LinkTimes {
  int rank = 0;             // r
  bool intra_node = true;   // r and r + 1 run on the same machine
  std::vector<double> one_way_s;
};

// The tensor-parallel test at one activation: the slowest process's mean
// round. nccl-tests' bus factors: 2(n − 1)/n for the all-reduce, (n − 1)/n
// for the all-gather (its bytes: the gathered whole).
struct TensorRow {
  std::array<std::int64_t, 3> activation{};
  CommRow all_reduce;
  CommRow all_gather;
};

struct CommbenchResult {
  int processes = 0;
  int hosts = 0;
  CommbenchOptions options;
  std::vector<CommRow> p2p;
  std::vector<CommRow> baseline;
  std::vector<CommRow> all_reduce;
  std::vector<LinkTimes> links;
  std::vector<TensorRow> tensor;  // with options.tensor_parallel > 0
};

// Runs the three tests; every process of `world` must call it (collective).
// Every process gets the whole result. Error when the world has fewer than
// 2 processes or the options are invalid; a peer that does not answer
// within options.timeout is an Error naming the test and the size.
CommbenchResult run_commbench(const MpiWorld& world, const CommbenchOptions& options);

// The human table (a row per size: each test's time, bandwidths and wrong
// elements, and p2p / baseline bandwidth) with a header naming the setup.
std::string commbench_text(const CommbenchResult& result);
// {"processes", "hosts", "iters", "warmup", "p2p": [rows], "all_reduce": [rows],
//  "baseline": [rows]}, a row {"bytes", "time_us", "algbw_GBps", "busbw_GBps",
//  "wrong_elements"}; with the tensor-parallel test also "tensor_parallel"
//  (the group size) and "tensor": [{"activation": [b, t, c], "all_reduce":
//  row, "all_gather": row}].
std::string commbench_json(const CommbenchResult& result);

// `base` with the link figures measured by the p2p test: for the links
// within a machine (intra_node_*) and across machines (inter_node_*), the
// slowest link of the kind per size, fitted to latency + bytes / bandwidth
// through its smallest and largest message:
//   latency   = time of the smallest message,
//   bandwidth = largest bytes / (its time − latency),
// so the profile reproduces both ends' times within smallest bytes /
// bandwidth. A kind not measured keeps base's figures; the measured keys
// leave `estimated`; the note says what was measured. Error when fewer than
// two sizes were measured or the largest message was not slower than the
// smallest.
HardwareProfile with_measured_links(HardwareProfile base, const CommbenchResult& result);

}  // namespace pipeflow::runtime
