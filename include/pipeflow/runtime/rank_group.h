#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/config/run_config.h"
#include "pipeflow/runtime/transport.h"
#include "pipeflow/tensor/half.h"

namespace pipeflow::runtime {

// How the ranks of a run are arranged: p pipeline ranks times d
// data-parallel replicas times t tensor-parallel ranks, N = p · d · t ranks,
// in Megatron-LM's order: the tensor-parallel rank varies fastest, then the
// data-parallel rank, so
//   world rank w = (pipeline_rank · d + data_rank) · t + tensor_rank.
// A tensor-parallel group (the t ranks that split the same stages between
// them and all-reduce inside every layer: the most frequent traffic) is t
// consecutive ranks, on one machine when mpirun fills machines in order; a
// data-parallel group (the ranks holding the same part of the same stages,
// which all-reduce gradients) is d ranks t apart; a pipeline (one replica's
// ranks of one tensor-parallel rank) is p ranks d · t apart. With order
// tp-pp-dp (Megatron's --use-tp-pp-dp-mapping) the data-parallel rank varies
// slowest instead: w = (data_rank · p + pipeline_rank) · t + tensor_rank.
struct RankLayout {
  int pipeline = 1;       // p
  int data_parallel = 1;  // d
  int tensor = 1;         // t
  RankOrder order = RankOrder::kTensorDataPipeline;

  int world_size() const { return pipeline * data_parallel * tensor; }
  int pipeline_rank(int world_rank) const {
    return data_slowest() ? world_rank / tensor % pipeline : world_rank / (data_parallel * tensor);
  }
  int data_rank(int world_rank) const {
    return data_slowest() ? world_rank / (tensor * pipeline) : world_rank / tensor % data_parallel;
  }
  int tensor_rank(int world_rank) const { return world_rank % tensor; }
  int world_rank(int pipeline_rank, int data_rank, int tensor_rank = 0) const {
    const int outer = data_slowest() ? data_rank * pipeline + pipeline_rank : pipeline_rank * data_parallel + data_rank;
    return outer * tensor + tensor_rank;
  }
  bool data_slowest() const { return order == RankOrder::kTensorPipelineData; }
  // One line per pipeline, per data-parallel and per tensor-parallel group
  // (the groups of one rank only):
  //   "pipeline (data-parallel rank 0): world ranks 0 2 4 6"
  //   "data-parallel group (pipeline rank 1): world ranks 2 3"
  //   "tensor-parallel group (pipeline rank 0, data-parallel rank 1): world ranks 2 3"
  std::string describe() const;
  // "pipeline 2 x data parallel 1", with " x tensor parallel 2" when t > 1.
  std::string dimensions() const;
};

// The sum of a sub-group's `values` reduced and scattered, under way: member
// k's part, nn::OptimizerShard::of(values.size(), members, k), ends as the
// sum over the members (in member order) of their part k; the rest of its
// `values` is unspecified. Posted when made, so it may advance while the
// member computes: poll() moves it on without waiting, finish() waits for
// the rest (an Error naming what it waited for once the deadline passes).
// `values` must outlive it.
class PartsReduction {
 public:
  virtual ~PartsReduction() = default;
  virtual void poll() = 0;
  virtual void finish(Deadline deadline) = 0;
};

// One member's view of a sub-group of ranks (the pipeline of a replica, a
// data-parallel group, the world), as an MPI communicator is: every member
// calls each collective, in the same order, with the same `what` (what the
// collective is for, named by an error). A wait past `deadline` is an Error
// naming `what`; a wait ended because another rank of the group failed
// throws RankGroupAborted (RankGroup::run absorbs it).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;

  // Every member's `values` (the same count on each), member by member.
  virtual std::vector<double> all_gather(std::span<const double> values, Deadline deadline,
                                         std::string_view what) = 0;
  // The reduce-scatter of PartsReduction, posted now in buckets of at most
  // `bucket_floats`.
  virtual std::unique_ptr<PartsReduction> reduce_scatter_parts(std::span<float> values, std::string what,
                                                               std::size_t bucket_floats) = 0;
  // Every member's part of `values` everywhere, in place: member k's part is
  // nn::OptimizerShard::of(values.size(), members, k) and already in place.
  virtual void all_gather_parts(std::span<float> values, Deadline deadline, std::string_view what) = 0;
  // The same at member 0 alone (the others' `values` unchanged).
  virtual void gather_parts(std::span<float> values, Deadline deadline, std::string_view what) = 0;
  // Every member's bytes at member 0 (empty elsewhere), member by member.
  virtual std::vector<std::string> gather_bytes(const std::string& bytes, Deadline deadline,
                                                std::string_view what) = 0;
  // Member 0's `bytes` at every member (in place).
  virtual void broadcast_bytes(std::string& bytes, Deadline deadline, std::string_view what) = 0;

  // The sum over the members of `values`, in place: reduce_scatter_parts,
  // then all_gather_parts (a ring all-reduce's two halves), so that each
  // element has the same bits as when a replica stops halfway (ZeRO-1).
  void all_reduce_sum(std::span<float> values, Deadline deadline, std::string_view what,
                      std::size_t bucket_floats);
  // Returns once every member has called it.
  void barrier(Deadline deadline, std::string_view what);
};

// Thrown out of a collective whose wait another rank's failure ended: the
// rank stops quietly, the failure is reported by the rank that failed.
class RankGroupAborted : public std::exception {
 public:
  const char* what() const noexcept override { return "the rank group was aborted: another rank failed"; }
};

// What a pipeline transport will carry in one step (or one generation):
// `inbox_capacity[r]`, the messages pipeline rank r is sent (the in-process
// inboxes are that large); `stages` and `microbatches` number the messages
// (MPI tags: stage · microbatches + micro-batch).
struct PipelineTraffic {
  std::vector<int> inbox_capacity;
  int stages = 1;
  int microbatches = 1;
  // The format of the activations and their gradients (bf16, fp16: every
  // value one of the format's): between processes they travel in 2 bytes a
  // value. The tied-embedding gradient and sampled tokens are fp32 always.
  ComputeFormat wire = ComputeFormat::kFp32;
};

class MpiWorld;

// How many cores the calling thread may run on: usable_cpus()
// (rank_threads.h), its CPU affinity (the process's, taskset or a cgroup
// cpuset, unless the thread was pinned), not every online CPU that
// hardware_concurrency counts (that only where the affinity is unknown).
int usable_cores();
// Empty when every rank has a core of its own; otherwise a warning that the
// ranks share the cores, so the measured step time, tokens/s and bubble are
// not those of a pipeline with one device per rank (`emulated`: the serial
// run, which times each action alone, says what it emulates instead).
// `can_emulate`: the run could be emulated (one pipeline, no data or tensor
// parallelism), so the warning points to --emulate.
std::string oversubscription_note(int ranks, int cores, bool emulated, bool can_emulate);

// Where the ranks of a run live, and the only place that knows: either every
// rank is a thread of this process, or each is an MPI process started by
// mpirun. It owns what differs between the two, behind one interface: the
// pipeline transport, the collectives over the pipeline, data-parallel and
// world sub-groups, the workers (threads pinned one per core when there are
// enough cores; mpirun binds processes), and the failure policy. Everything
// above it (the engine, the trainer, inference, commbench) is written once,
// as what each rank does.
//
// Thread safety: one thread owns the group and calls run(); a local rank's
// job uses its own communicators and transport.
class RankGroup {
 public:
  // Every rank of `layout` a thread of this process.
  static std::unique_ptr<RankGroup> in_threads(RankLayout layout);
  // This process's rank of a job started by mpirun: Error when the job's
  // size is not layout.world_size().
  static std::unique_ptr<RankGroup> in_processes(const MpiWorld& world, RankLayout layout);
  // In processes when the command runs under mpirun (`world` given), in
  // threads otherwise: the one place that chooses.
  static std::unique_ptr<RankGroup> make(const MpiWorld* world, RankLayout layout);

  virtual ~RankGroup() = default;
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  const RankLayout& layout() const { return layout_; }
  // The world ranks this process runs, in increasing order.
  const std::vector<int>& local_ranks() const { return local_ranks_; }
  bool is_local(int world_rank) const;
  // Whether this process runs world rank 0, which prints and writes the run's files.
  bool is_reporter() const { return is_local(0); }
  // Whether the ranks are spread over several processes (mpirun): whole-model
  // files are then written in shards, one per process.
  virtual bool spans_processes() const = 0;
  // Whether two world ranks run in the same process (the same answer in every process).
  virtual bool shares_process(int world_rank_a, int world_rank_b) const = 0;

  // The sub-groups of local rank `world_rank`.
  virtual Communicator& world(int world_rank) = 0;
  virtual Communicator& pipeline(int world_rank) = 0;  // its replica's pipeline, by pipeline rank
  virtual Communicator& data(int world_rank) = 0;      // its pipeline rank's replicas, by data rank
  virtual Communicator& tensor(int world_rank) = 0;    // the ranks splitting its stages, by tensor rank

  // The transport between the pipeline ranks of replica `data_rank` and
  // tensor-parallel rank `tensor_rank` (one held here) for `traffic`.
  virtual std::unique_ptr<Transport> pipeline_transport(int data_rank, int tensor_rank,
                                                        const PipelineTraffic& traffic) = 0;

  // Runs job(world_rank) for every local rank at once and returns when every
  // one has returned. The failure policy: the first job that throws (other
  // than RankGroupAborted) has `abort` called (which must wake the other
  // ranks' transport waits) and every collective wait of the group end with
  // RankGroupAborted; once all have returned, its error is rethrown. Under
  // mpirun a failure ends the whole job instead (every process, at once,
  // naming the process): peers cannot be told to stop half way.
  virtual void run(const std::function<void(int world_rank)>& job, const std::function<void()>& abort) = 0;

  // The largest `value` any process of the group holds (a stop request, so
  // that every process stops after the same step): called by the thread
  // that owns the group, between runs, in every process; within one process
  // there is nothing to exchange.
  virtual double max_over_processes(double value, Deadline deadline, std::string_view what) = 0;

  // This process's steady clock minus world rank 0's (0 within one process).
  virtual double clock_offset_s() const = 0;
  // Where the ranks run, for the run's header: "one worker thread per rank
  // on a machine with 2 cores", "4 MPI processes (pipeline 2 x data parallel
  // 2), 4 on this machine (host, 2 cores)".
  virtual std::string placement() const = 0;
  // Empty, or why measured times are not a real pipeline's (more ranks than
  // cores); `emulated`: the serial run, which times each action alone;
  // `can_emulate`: whether the run's kind of model has that serial run to offer.
  virtual std::string oversubscription(bool emulated, bool can_emulate) const = 0;

 protected:
  RankGroup(RankLayout layout, std::vector<int> local_ranks);

 private:
  RankLayout layout_;
  std::vector<int> local_ranks_;
};

}  // namespace pipeflow::runtime
