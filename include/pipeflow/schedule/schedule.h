#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/core/ids.h"
#include "pipeflow/schedule/action.h"

namespace pipeflow {

// How the (virtual) stages sit on the ranks.
//   kLoop: stage s on rank s % ranks (Megatron's interleaving, PyTorch's "loop"):
//          rank r holds stages r, r + p, r + 2p, ...
//   kV:    exactly two stages per rank, rank r holds stages r and 2p - 1 - r
//          (PyTorch's "v" style, ZB-V, DualPipeV): the last stage is on rank 0
//          and the turn from stage p - 1 to stage p stays on rank p - 1.
enum class Placement { kLoop, kV };

std::string_view to_string(Placement placement);  // "loop", "v"

// A pipeline schedule: for each rank, the ordered list of actions it runs in
// one optimizer step. The schedule owns its lists; generators build them,
// lowering passes rewrite copies, and the validator, the executor, the
// simulator and the runtime only read them.
//
// A schedule is "compute-only" while it holds only F/B/I/W actions and
// "lowered" once it holds SEND/RECV actions (has_communication()).
//
// A training schedule runs a backward for every forward; an inference
// schedule (is_inference(), DeepSpeed's InferenceSchedule) runs forwards
// only, and the validator reports any backward in it.
//
// Thread safety: const member functions may be called from several threads;
// mutation needs exclusive access.
class Schedule {
 public:
  // At most this many (stage, micro-batch) pairs. The validator and the
  // executor keep a table entry per pair and action kind (the validator's
  // reach 0.7 GB at the limit), so a mistyped size must fail at once instead
  // of exhausting memory or running for hours. p = 128 ranks with v = 4
  // chunks and m = 4096 micro-batches is half the limit.
  static constexpr std::int64_t kMaxStageMicrobatches = std::int64_t{1} << 22;

  // `name` names the generator ("1f1b") or the source ("run.csv"). Throws
  // Error unless ranks >= 1, microbatches >= 1, stages a positive multiple of
  // ranks, (for kV) stages == 2 * ranks, and stages * microbatches <=
  // kMaxStageMicrobatches.
  Schedule(std::string name, int num_ranks, int num_stages, int num_microbatches, Placement placement);

  const std::string& name() const { return name_; }
  int num_ranks() const { return num_ranks_; }
  int num_stages() const { return num_stages_; }
  int num_microbatches() const { return num_microbatches_; }
  Placement placement() const { return placement_; }
  // Model chunks per rank (v): num_stages / num_ranks.
  int chunks_per_rank() const { return num_stages_ / num_ranks_; }

  // The rank holding `stage` (which must be in [0, num_stages)).
  RankId rank_of(StageId stage) const;
  // The stages of `rank`, in increasing order.
  std::vector<StageId> stages_of(RankId rank) const;
  // Which of its rank's chunks `stage` is: stage / num_ranks (0 for the first
  // chunk of a rank, 1 for the second, ... under both placements).
  int chunk_of(StageId stage) const { return stage.value() / num_ranks_; }
  bool is_last_stage(StageId stage) const { return stage.value() == num_stages_ - 1; }

  bool is_inference() const { return inference_; }
  // Marks the schedule forward-only (what a generator of the inference
  // family, a JSON file's "inference": true or `validate --inference` says).
  void set_inference(bool inference) { inference_ = inference; }

  // The rank a SEND's message goes to or a RECV's comes from: the rank of
  // partner(message)'s stage. Empty where that stage does not exist -- RECV_F
  // and SEND_B of the first stage, SEND_F and RECV_B of the last -- which a
  // lowered schedule never holds (the validator reports it). The peer may be
  // the message's own rank when both stages share it (a message the
  // validator reports as carrying nothing). Precondition: a SEND or RECV
  // (see partner).
  std::optional<RankId> peer_rank(const Action& message) const;

  const std::vector<Action>& actions(RankId rank) const;
  std::vector<Action>& mutable_actions(RankId rank);
  void add(RankId rank, Action action) { mutable_actions(rank).push_back(action); }

  bool has_communication() const;
  std::size_t total_actions() const;

 private:
  void check_rank(RankId rank) const;

  std::string name_;
  int num_ranks_;
  int num_stages_;
  int num_microbatches_;
  Placement placement_;
  bool inference_ = false;
  std::vector<std::vector<Action>> actions_;
};

}  // namespace pipeflow
