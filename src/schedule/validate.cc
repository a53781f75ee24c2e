#include "pipeflow/schedule/validate.h"

#include <algorithm>
#include <cstdint>

#include "pipeflow/core/error.h"
#include "pipeflow/core/units.h"
#include "pipeflow/schedule/grid.h"

namespace pipeflow {
namespace {

struct Position {
  int rank = -1;
  std::size_t index = 0;
  bool exists() const { return rank >= 0; }
};

class Validator {
 public:
  explicit Validator(const Schedule& schedule)
      : s_(schedule), stages_(schedule.num_stages()), microbatches_(schedule.num_microbatches()) {
    const std::size_t keys = static_cast<std::size_t>(kNumActionKinds) * static_cast<std::size_t>(stages_) *
                             static_cast<std::size_t>(microbatches_);
    first_.assign(keys, Position{});
    count_.assign(keys, 0);
  }

  ValidationReport run() {
    const bool in_range = index_actions();
    check_counts();
    check_stage_order();
    check_same_rank_dependencies();
    if (s_.has_communication()) {
      check_messages();
      check_cross_rank_edges();
    }
    if (in_range) run_dry_run();
    measure_inflight();
    return std::move(report_);
  }

 private:
  std::size_t key(const Action& a) const {
    return (static_cast<std::size_t>(a.kind) * static_cast<std::size_t>(stages_) +
            static_cast<std::size_t>(a.stage.value())) *
               static_cast<std::size_t>(microbatches_) +
           static_cast<std::size_t>(a.microbatch.value());
  }
  Position at(const Action& a) const { return first_[key(a)]; }
  Position at(int stage, ActionKind kind, int microbatch) const {
    return at(Action{StageId(stage), kind, MicrobatchId(microbatch)});
  }
  const Action& action_at(Position p) const { return s_.actions(RankId(p.rank))[p.index]; }
  // Where the B or I of (stage, microbatch) is, if either exists.
  Position gradient_at(int stage, int microbatch) const {
    const Position full = at(stage, ActionKind::kBackward, microbatch);
    return full.exists() ? full : at(stage, ActionKind::kBackwardInput, microbatch);
  }

  void add(std::string rule, Position cell, std::string message) {
    if (report_.violations.size() >= ValidationReport::kMaxListed) {
      ++report_.unlisted;
      return;
    }
    Violation v{std::move(rule), std::move(message), std::nullopt, 0};
    if (cell.exists()) {
      v.message = fmt::format("rank {} step {}: {}", cell.rank, cell.index, v.message);
      v.rank = RankId(cell.rank);
      v.index = cell.index;
    }
    report_.violations.push_back(std::move(v));
  }

  // The schedule's stage -> rank map in words.
  std::string placement_rule() const {
    const int p = s_.num_ranks();
    if (s_.placement() == Placement::kLoop) return fmt::format("loop placement: stage s on rank s % {}", p);
    return fmt::format("v placement: rank r holds stages r and {} - r", 2 * p - 1);
  }

  bool in_range(const Action& a) const {
    return a.stage.value() >= 0 && a.stage.value() < stages_ && a.microbatch.value() >= 0 &&
           a.microbatch.value() < microbatches_;
  }

  // Range, placement and duplicates; returns whether every action is in range.
  bool index_actions() {
    bool all_in_range = true;
    for (int r = 0; r < s_.num_ranks(); ++r) {
      const auto& actions = s_.actions(RankId(r));
      for (std::size_t i = 0; i < actions.size(); ++i) {
        const Action& a = actions[i];
        const Position here{r, i};
        if (a.kind == ActionKind::kBackwardInput || a.kind == ActionKind::kBackwardWeight) {
          report_.split_backward = true;
        }
        if (!in_range(a)) {
          all_in_range = false;
          add("range", here,
              fmt::format("{} lies outside the schedule's stages 0..{} and micro-batches 0..{}", to_string(a),
                          stages_ - 1, microbatches_ - 1));
          continue;
        }
        if (s_.is_inference() && is_compute(a.kind) && a.kind != ActionKind::kForward) {
          add("forward-only", here,
              fmt::format("{} is a backward, but an inference schedule runs forwards only: remove it, or mark the "
                          "schedule as training",
                          to_string(a)));
        }
        const RankId home = s_.rank_of(a.stage);
        if (home.value() != r) {
          add("placement", here,
              fmt::format("{} is on rank {}, but stage {} sits on rank {} ({}): move it to rank {} or correct its "
                          "stage",
                          to_string(a), r, a.stage.value(), home.value(), placement_rule(), home.value()));
        }
        const std::size_t k = key(a);
        if (count_[k]++ == 0) {
          first_[k] = here;
        } else {
          add("count", here,
              fmt::format("{} appears twice (first at rank {} step {}): each action runs once", to_string(a),
                          first_[k].rank, first_[k].index));
        }
      }
    }
    return all_in_range;
  }

  int count(int stage, ActionKind kind, int microbatch) const {
    return count_[key(Action{StageId(stage), kind, MicrobatchId(microbatch)})];
  }

  void check_counts() {
    for (int s = 0; s < stages_; ++s) {
      for (int k = 0; k < microbatches_; ++k) {
        const int f = count(s, ActionKind::kForward, k);
        const int b = count(s, ActionKind::kBackward, k);
        const int i = count(s, ActionKind::kBackwardInput, k);
        const int w = count(s, ActionKind::kBackwardWeight, k);
        const std::string what = fmt::format("stage {} micro-batch {}", s, k);
        if (f == 0) add("count", gradient_at(s, k), fmt::format("{} has no forward ({}F{})", what, s, k));
        if (s_.is_inference()) continue;  // its backwards are forward-only violations
        if (b == 0 && i == 0 && w == 0) {
          add("count", at(s, ActionKind::kForward, k),
              fmt::format("{} has no backward: it needs {}B{}, or {}I{} and {}W{}", what, s, k, s, k, s, k));
        } else if (b > 0 && (i > 0 || w > 0)) {
          add("count", at(s, i > 0 ? ActionKind::kBackwardInput : ActionKind::kBackwardWeight, k),
              fmt::format("{} has both a full backward B and a split one (I/W): use one or the other", what));
        } else if (i > 0 && w == 0) {
          add("count", at(s, ActionKind::kBackwardInput, k),
              fmt::format("{} has {}I{} but no {}W{}: a split backward needs both", what, s, k, s, k));
        } else if (w > 0 && i == 0) {
          add("count", at(s, ActionKind::kBackwardWeight, k),
              fmt::format("{} has {}W{} but no {}I{}: a split backward needs both", what, s, k, s, k));
        }
      }
    }
  }

  // `later` must come after `earlier` on the same rank.
  void require_before(const char* rule, Position earlier, Position later, const std::string& why) {
    if (!earlier.exists() || !later.exists() || earlier.rank != later.rank || earlier.index < later.index) return;
    add(rule, later,
        fmt::format("{} runs before {} (step {}): {}", to_string(action_at(later)), to_string(action_at(earlier)),
                    earlier.index, why));
  }

  void check_stage_order() {
    for (int s = 0; s < stages_; ++s) {
      for (int k = 0; k < microbatches_; ++k) {
        const Position f = at(s, ActionKind::kForward, k);
        require_before("order", f, at(s, ActionKind::kBackward, k), "a stage's backward needs its forward first");
        require_before("order", f, at(s, ActionKind::kBackwardInput, k),
                       "a stage's backward needs its forward first");
        require_before("order", at(s, ActionKind::kBackwardInput, k), at(s, ActionKind::kBackwardWeight, k),
                       "W needs the I of its micro-batch first");
      }
    }
  }

  void check_same_rank_dependencies() {
    for (int s = 0; s < stages_; ++s) {
      for (int k = 0; k < microbatches_; ++k) {
        if (s > 0) {
          require_before("dependency", at(s - 1, ActionKind::kForward, k), at(s, ActionKind::kForward, k),
                         fmt::format("stage {}'s forward needs stage {}'s output", s, s - 1));
        }
        if (s + 1 < stages_) {
          const std::string why = fmt::format("stage {}'s backward needs stage {}'s input gradient", s, s + 1);
          require_before("dependency", gradient_at(s + 1, k), at(s, ActionKind::kBackward, k), why);
          require_before("dependency", gradient_at(s + 1, k), at(s, ActionKind::kBackwardInput, k), why);
        }
      }
    }
  }

  // Every SEND/RECV: a neighbour stage on another rank, and its partner present.
  void check_messages() {
    for (int r = 0; r < s_.num_ranks(); ++r) {
      const auto& actions = s_.actions(RankId(r));
      for (std::size_t i = 0; i < actions.size(); ++i) {
        const Action& a = actions[i];
        if (is_compute(a.kind) || !in_range(a)) continue;
        check_message(Position{r, i}, a);
      }
    }
  }

  void check_message(Position here, const Action& a) {
    const Action other = partner(a);
    const std::optional<RankId> peer = s_.peer_rank(a);
    if (!peer) {
      add("comm", here,
          fmt::format("{} has no partner: stage {} is the {} stage", to_string(a), a.stage.value(),
                      other.stage.value() < 0 ? "first" : "last"));
      return;
    }
    if (*peer == s_.rank_of(a.stage)) {
      add("comm", here,
          fmt::format("{} carries no cross-rank dependency: stages {} and {} share rank {}; remove it", to_string(a),
                      std::min(a.stage, other.stage).value(), std::max(a.stage, other.stage).value(),
                      peer->value()));
      return;
    }
    if (!at(other).exists()) {
      add("comm", here,
          fmt::format("{} has no partner {} on rank {}: every {} pairs with one {}", to_string(a), to_string(other),
                      peer->value(), kind_token(a.kind), kind_token(other.kind)));
    }
  }

  // A cross-rank dependency producer -> consumer needs a SEND after the
  // producer and a RECV before the consumer, each on its own rank.
  void check_edge(Position producer, const Action& send, Position consumer, const Action& recv) {
    const Position sent = at(send);
    const Position received = at(recv);
    if (producer.exists()) {
      if (!sent.exists()) {
        add("comm", producer,
            fmt::format("{} feeds stage {} on another rank but no {} follows it", to_string(action_at(producer)),
                        recv.stage.value(), to_string(send)));
      } else {
        require_before("comm", producer, sent, "a SEND needs its producer first");
      }
    }
    if (consumer.exists()) {
      if (!received.exists()) {
        add("comm", consumer,
            fmt::format("{} needs stage {}'s result from another rank but no {} precedes it",
                        to_string(action_at(consumer)), send.stage.value(), to_string(recv)));
      } else if (received.rank == consumer.rank && received.index > consumer.index) {
        add("comm", received,
            fmt::format("{} comes after its consumer {} (step {}): receive before use", to_string(recv),
                        to_string(action_at(consumer)), consumer.index));
      }
    }
  }

  void check_cross_rank_edges() {
    for (int s = 0; s + 1 < stages_; ++s) {
      if (s_.rank_of(StageId(s)) == s_.rank_of(StageId(s + 1))) continue;
      for (int k = 0; k < microbatches_; ++k) {
        const MicrobatchId mb(k);
        const Action activation{StageId(s), ActionKind::kSendForward, mb};
        const Action gradient{StageId(s + 1), ActionKind::kSendBackward, mb};
        check_edge(at(s, ActionKind::kForward, k), activation, at(s + 1, ActionKind::kForward, k), partner(activation));
        check_edge(gradient_at(s + 1, k), gradient, gradient_at(s, k), partner(gradient));
      }
    }
  }

  void run_dry_run() {
    report_.dry_run = dry_run(s_);
    for (const StuckRank& stuck : report_.dry_run->stuck) {
      Violation v{"deadlock", stuck.message, stuck.rank, stuck.index};
      report_.violations.push_back(std::move(v));
    }
  }

  void measure_inflight() {
    for (int r = 0; r < s_.num_ranks(); ++r) {
      int until_input = 0;
      int until_weight = 0;
      int peak_input = 0;
      int peak_weight = 0;
      for (const Action& a : s_.actions(RankId(r))) {
        if (a.kind == ActionKind::kForward) {
          peak_input = std::max(peak_input, ++until_input);
          peak_weight = std::max(peak_weight, ++until_weight);
        }
        if (is_input_backward(a.kind)) --until_input;
        if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --until_weight;
      }
      report_.peak_inflight.push_back(peak_input);
      report_.peak_inflight_until_weight.push_back(peak_weight);
    }
  }

  const Schedule& s_;
  const int stages_;
  const int microbatches_;
  std::vector<Position> first_;  // per action key: its first occurrence
  std::vector<int> count_;       // per action key: occurrences
  ValidationReport report_;
};

std::string join_ints(const std::vector<int>& values) {
  std::string out;
  for (int v : values) {
    if (!out.empty()) out += ' ';
    out += std::to_string(v);
  }
  return out;
}

std::string describe(const Schedule& schedule) {
  auto count = [](std::size_t n, const char* one, const char* many) { return fmt::format("{} {}", n, n == 1 ? one : many); };
  return fmt::format("{}: {}{}, {} ({} placement), {}, {}, {}", schedule.name(),
                     schedule.is_inference() ? "inference (forward only), " : "",
                     count(static_cast<std::size_t>(schedule.num_ranks()), "rank", "ranks"),
                     count(static_cast<std::size_t>(schedule.num_stages()), "stage", "stages"), to_string(schedule.placement()),
                     count(static_cast<std::size_t>(schedule.num_microbatches()), "micro-batch", "micro-batches"),
                     schedule.has_communication() ? "lowered" : "compute-only",
                     count(schedule.total_actions(), "action", "actions"));
}

}  // namespace

ValidationReport validate(const Schedule& schedule) { return Validator(schedule).run(); }

std::string ValidationReport::render(const Schedule& schedule) const {
  const std::size_t total = violations.size() + unlisted;
  std::string out = fmt::format("{}\n{} violation{}{}:\n", describe(schedule), total, total == 1 ? "" : "s",
                                unlisted > 0 ? fmt::format(" (the first {} listed)", violations.size()) : "");
  std::vector<GridMark> marks;
  for (std::size_t i = 0; i < violations.size(); ++i) {
    const Violation& v = violations[i];
    out += fmt::format("[{}] {}: {}\n", i + 1, v.rule, v.message);
    if (v.rank) marks.push_back({*v.rank, v.index, static_cast<int>(i + 1)});
  }
  return out + "\n" + render_grid(schedule, marks);
}

std::string ValidationReport::summary(const Schedule& schedule) const {
  std::string out = describe(schedule) + "\n";
  if (dry_run && !dry_run->deadlocked) {
    out += fmt::format("unit-cost makespan {:g} (F=1, B=2, I=W=1, no transfer time{}), bubble {}\n",
                       dry_run->makespan, schedule.has_communication() ? ", rendezvous send/recv" : "",
                       format_percent(bubble_fraction(*dry_run)));
  }
  if (schedule.is_inference()) return out + "forward only: no activation is kept for a backward\n";
  out += fmt::format("peak in-flight micro-batch chunks per rank: {}\n", join_ints(peak_inflight));
  if (split_backward) {
    out += fmt::format("peak in-flight until W per rank: {}\n", join_ints(peak_inflight_until_weight));
  }
  return out;
}

}  // namespace pipeflow
