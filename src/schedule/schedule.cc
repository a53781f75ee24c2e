#include "pipeflow/schedule/schedule.h"

#include <algorithm>

#include "pipeflow/core/error.h"

namespace pipeflow {

std::string_view to_string(Placement placement) { return placement == Placement::kLoop ? "loop" : "v"; }

Schedule::Schedule(std::string name, int num_ranks, int num_stages, int num_microbatches, Placement placement)
    : name_(std::move(name)),
      num_ranks_(num_ranks),
      num_stages_(num_stages),
      num_microbatches_(num_microbatches),
      placement_(placement) {
  if (num_ranks < 1) fail("schedule {} needs ranks >= 1 (got {})", name_, num_ranks);
  if (num_microbatches < 1) fail("schedule {} needs microbatches >= 1 (got {})", name_, num_microbatches);
  if (num_stages < num_ranks || num_stages % num_ranks != 0) {
    fail("schedule {} needs stages to be a positive multiple of ranks (got {} stages on {} ranks)", name_,
         num_stages, num_ranks);
  }
  if (placement == Placement::kV && num_stages != 2 * num_ranks) {
    fail("schedule {}: V placement holds exactly 2 stages per rank (got {} stages on {} ranks)", name_,
         num_stages, num_ranks);
  }
  const std::int64_t pairs = std::int64_t{num_stages} * num_microbatches;
  if (pairs > kMaxStageMicrobatches) {
    fail("schedule {} is too large: {} stages x {} microbatches = {} (stage, micro-batch) pairs, more than the "
         "limit of {}: use fewer stages or microbatches",
         name_, num_stages, num_microbatches, pairs, kMaxStageMicrobatches);
  }
  actions_.resize(static_cast<std::size_t>(num_ranks));
}

RankId Schedule::rank_of(StageId stage) const {
  const int s = stage.value();
  if (s < 0 || s >= num_stages_) {
    fail("internal: stage {} out of range [0, {}) in schedule {}", s, num_stages_, name_);
  }
  if (placement_ == Placement::kLoop) return RankId(s % num_ranks_);
  return RankId(s < num_ranks_ ? s : 2 * num_ranks_ - 1 - s);
}

std::vector<StageId> Schedule::stages_of(RankId rank) const {
  check_rank(rank);
  std::vector<StageId> stages;
  for (int s = 0; s < num_stages_; ++s) {
    if (rank_of(StageId(s)) == rank) stages.push_back(StageId(s));
  }
  return stages;
}

std::optional<RankId> Schedule::peer_rank(const Action& message) const {
  const int peer_stage = partner(message).stage.value();
  if (peer_stage < 0 || peer_stage >= num_stages_) return std::nullopt;
  return rank_of(StageId(peer_stage));
}

const std::vector<Action>& Schedule::actions(RankId rank) const {
  check_rank(rank);
  return actions_[static_cast<std::size_t>(rank.value())];
}

std::vector<Action>& Schedule::mutable_actions(RankId rank) {
  check_rank(rank);
  return actions_[static_cast<std::size_t>(rank.value())];
}

bool Schedule::has_communication() const {
  return std::any_of(actions_.begin(), actions_.end(), [](const std::vector<Action>& list) {
    return std::any_of(list.begin(), list.end(), [](const Action& a) { return is_communication(a.kind); });
  });
}

std::size_t Schedule::total_actions() const {
  std::size_t total = 0;
  for (const auto& list : actions_) total += list.size();
  return total;
}

void Schedule::check_rank(RankId rank) const {
  if (rank.value() < 0 || rank.value() >= num_ranks_) {
    fail("internal: rank {} out of range [0, {}) in schedule {}", rank.value(), num_ranks_, name_);
  }
}

}  // namespace pipeflow
