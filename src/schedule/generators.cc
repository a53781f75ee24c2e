#include "pipeflow/schedule/generators.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

// The small verbs every generator is written in: one rank's list, with a
// forward and a backward counter per stage (micro-batches run in increasing
// order per stage unless a generator says otherwise) and the queue of W's
// whose I has run.
class RankPlan {
 public:
  RankPlan(Schedule& schedule, int rank)
      : schedule_(schedule), rank_(rank), forwards_(static_cast<std::size_t>(schedule.num_stages()), 0),
        backwards_(static_cast<std::size_t>(schedule.num_stages()), 0) {}

  void push(int stage, ActionKind kind, int microbatch) {
    schedule_.add(RankId(rank_), Action{StageId(stage), kind, MicrobatchId(microbatch)});
  }
  void forward(int stage) { push(stage, ActionKind::kForward, forwards_[index(stage)]++); }
  void backward(int stage) { push(stage, ActionKind::kBackward, backwards_[index(stage)]++); }
  // I now, its W queued for weight().
  void backward_input(int stage) {
    const int microbatch = backwards_[index(stage)]++;
    push(stage, ActionKind::kBackwardInput, microbatch);
    pending_weights_.push_back(microbatch * schedule_.num_stages() + stage);
  }
  void backward_maybe_split(int stage, bool split) { split ? backward_input(stage) : backward(stage); }
  // The oldest pending W (of `stage`, if given); false if none is pending.
  bool weight(int stage = -1) {
    const int stages = schedule_.num_stages();
    const auto it = std::find_if(pending_weights_.begin(), pending_weights_.end(),
                                 [&](int w) { return stage < 0 || w % stages == stage; });
    if (it == pending_weights_.end()) return false;
    push(*it % stages, ActionKind::kBackwardWeight, *it / stages);
    pending_weights_.erase(it);
    return true;
  }
  void all_weights(int stage = -1) {
    while (weight(stage)) {
    }
  }
  int forwards(int stage) const { return forwards_[index(stage)]; }

 private:
  static std::size_t index(int stage) { return static_cast<std::size_t>(stage); }

  Schedule& schedule_;
  int rank_;
  std::vector<int> forwards_;
  std::vector<int> backwards_;
  std::deque<int> pending_weights_;  // microbatch * stages + stage, oldest first
};

// The requirements, one per family of constraints, each in the registry's
// shape (name, ranks, microbatches, chunks_per_rank) so that an entry can
// name the one its generator calls.
void require_basics(std::string_view name, int ranks, int microbatches, int /*chunks_per_rank*/ = 1) {
  if (ranks < 1) fail("{} needs stages >= 1 (got {}): stages counts pipeline ranks", name, ranks);
  if (microbatches < 1) fail("{} needs microbatches >= 1 (got {})", name, microbatches);
}

void require_microbatches_at_least_stages(std::string_view name, int ranks, int microbatches,
                                          int /*chunks_per_rank*/ = 1) {
  require_basics(name, ranks, microbatches);
  if (microbatches < ranks) {
    fail("{} needs microbatches >= stages (got {} < {}): raise gradient_accumulation_steps or use gpipe", name,
         microbatches, ranks);
  }
}

void require_v_shape(std::string_view name, int ranks, int microbatches, int /*chunks_per_rank*/ = 2) {
  require_basics(name, ranks, microbatches);
  if (microbatches < 2 * ranks) {
    fail("{} needs microbatches >= 2 * stages (got {} < {}): it holds 2 chunks per rank; raise "
         "gradient_accumulation_steps or use zb-h1",
         name, microbatches, 2 * ranks);
  }
}

void require_virtual(std::string_view name, int chunks_per_rank) {
  if (chunks_per_rank < 1) fail("{} needs virtual stages per rank >= 1 (got {})", name, chunks_per_rank);
}

void require_looped(std::string_view name, int ranks, int microbatches, int chunks_per_rank) {
  require_basics(name, ranks, microbatches);
  require_virtual(name, chunks_per_rank);
}

// interleaved_microbatch_group refuses m < p with Megatron-core's reason.
void require_interleaved(std::string_view name, int ranks, int microbatches, int chunks_per_rank) {
  require_virtual(name, chunks_per_rank);
  interleaved_microbatch_group(ranks, microbatches);
}

// Megatron-core: p <= g <= m, and the last group m % g is 0 or >= p (a
// shorter last group would stall the pipeline on dependencies).
bool valid_microbatch_group(int ranks, int microbatches, int group) {
  return group >= ranks && group <= microbatches &&
         (microbatches % group == 0 || microbatches % group >= ranks);
}

// Megatron-core's get_schedule_table, chunk column: micro-batch groups of g,
// each group through chunk 0, then chunk 1, ...; the last group takes the rest.
std::vector<int> forward_chunk_order(int microbatches, int chunks, int group) {
  std::vector<int> order;
  for (int low = 0; low < microbatches; low += group) {
    const int size = low + group >= microbatches ? microbatches - low : group;
    for (int chunk = 0; chunk < chunks; ++chunk) order.insert(order.end(), static_cast<std::size_t>(size), chunk);
    if (size != group) break;
  }
  return order;
}

// Builds a schedule rank by rank: fill(plan, r) writes rank r's list.
template <class Fill>
Schedule build(std::string name, int ranks, int stages, int microbatches, Placement placement, Fill fill) {
  Schedule schedule(std::move(name), ranks, stages, microbatches, placement);
  for (int r = 0; r < ranks; ++r) {
    RankPlan plan(schedule, r);
    fill(plan, r);
  }
  return schedule;
}

}  // namespace

Schedule make_gpipe(int ranks, int microbatches) {
  require_basics("gpipe", ranks, microbatches);
  return build("gpipe", ranks, ranks, microbatches, Placement::kLoop, [&](RankPlan& plan, int r) {
    for (int k = 0; k < microbatches; ++k) plan.forward(r);
    for (int k = 0; k < microbatches; ++k) plan.backward(r);
  });
}

Schedule make_1f1b(int ranks, int microbatches) {
  require_microbatches_at_least_stages("1f1b", ranks, microbatches);
  return build("1f1b", ranks, ranks, microbatches, Placement::kLoop, [&](RankPlan& plan, int r) {
    const int warmup = ranks - r - 1;
    for (int k = 0; k < warmup; ++k) plan.forward(r);
    for (int k = 0; k < microbatches - warmup; ++k) {
      plan.forward(r);
      plan.backward(r);
    }
    for (int k = 0; k < warmup; ++k) plan.backward(r);
  });
}

int interleaved_microbatch_group(int ranks, int microbatches) {
  require_basics("interleaved-1f1b", ranks, microbatches);
  if (microbatches < ranks) {
    fail("interleaved-1f1b needs microbatches >= stages (got {} < {}): Megatron-core's micro-batch group lies "
         "in [stages, microbatches]; raise gradient_accumulation_steps or use looped-bfs",
         microbatches, ranks);
  }
  int group = ranks;
  while (!valid_microbatch_group(ranks, microbatches, group)) ++group;
  return group;
}

Schedule make_interleaved_1f1b(int ranks, int microbatches, int chunks_per_rank, int microbatch_group) {
  require_interleaved("interleaved-1f1b", ranks, microbatches, chunks_per_rank);
  const int auto_group = interleaved_microbatch_group(ranks, microbatches);
  const int group = microbatch_group == 0 ? auto_group : microbatch_group;
  if (!valid_microbatch_group(ranks, microbatches, group)) {
    fail("interleaved-1f1b micro-batch group {} is invalid for {} stages and {} microbatches: Megatron-core "
         "needs stages <= group <= microbatches and microbatches % group == 0 or >= stages; use {}",
         group, ranks, microbatches, auto_group);
  }
  const int chunks = chunks_per_rank;
  const std::vector<int> order = forward_chunk_order(microbatches, chunks, group);
  const int total = microbatches * chunks;
  return build("interleaved-1f1b", ranks, ranks * chunks, microbatches, Placement::kLoop, [&](RankPlan& plan, int r) {
    const int warmup = chunks == 1 ? std::min(ranks - r - 1, total)
                                   : std::min((ranks - r - 1) * 2 + (chunks - 1) * group, total);
    auto forward = [&](int k) { plan.forward(order[static_cast<std::size_t>(k)] * ranks + r); };
    auto backward = [&](int k) { plan.backward((chunks - 1 - order[static_cast<std::size_t>(k)]) * ranks + r); };
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k < total - warmup; ++k) {
      forward(k + warmup);
      backward(k);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  });
}

Schedule make_looped_bfs(int ranks, int microbatches, int chunks_per_rank) {
  require_looped("looped-bfs", ranks, microbatches, chunks_per_rank);
  const int chunks = chunks_per_rank;
  return build("looped-bfs", ranks, ranks * chunks, microbatches, Placement::kLoop, [&](RankPlan& plan, int r) {
    for (int chunk = 0; chunk < chunks; ++chunk) {
      for (int k = 0; k < microbatches; ++k) plan.forward(chunk * ranks + r);
    }
    for (int chunk = chunks - 1; chunk >= 0; --chunk) {
      for (int k = microbatches - 1; k >= 0; --k) plan.push(chunk * ranks + r, ActionKind::kBackward, k);
    }
  });
}

Schedule make_zb_h1(int ranks, int microbatches) {
  require_microbatches_at_least_stages("zb-h1", ranks, microbatches);
  return build("zb-h1", ranks, ranks, microbatches, Placement::kLoop, [&](RankPlan& plan, int r) {
    for (int k = 0; k < ranks - r - 1; ++k) plan.forward(r);
    for (int k = 0; k < microbatches; ++k) {
      if (plan.forwards(r) < microbatches) plan.forward(r);
      plan.backward_input(r);
      if (k >= r) plan.weight();
    }
    plan.all_weights();
  });
}

Schedule make_zb_h2(int ranks, int microbatches) {
  require_microbatches_at_least_stages("zb-h2", ranks, microbatches);
  return build("zb-h2", ranks, ranks, microbatches, Placement::kLoop, [&](RankPlan& plan, int r) {
    const int warmup = std::min(2 * (ranks - r) - 1, microbatches);
    const int deferred = std::max(0, 2 * r - std::max(0, 2 * ranks - 1 - microbatches));
    for (int k = 0; k < warmup; ++k) plan.forward(r);
    for (int k = 0; k < microbatches; ++k) {
      plan.backward_input(r);
      if (k >= deferred) plan.weight();
      if (plan.forwards(r) < microbatches) plan.forward(r);
    }
    plan.all_weights();
  });
}

Schedule make_zbv(int ranks, int microbatches) {
  require_v_shape("zbv", ranks, microbatches);
  const int p = ranks;
  const int m = microbatches;
  return build("zbv", p, 2 * p, m, Placement::kV, [&](RankPlan& plan, int r) {
    const int c0 = r;               // chunk 0: stage r
    const int c1 = 2 * p - 1 - r;  // chunk 1: stage 2p - 1 - r
    for (int k = 0; k < 2 * (p - r) - 1; ++k) plan.forward(c0);  // warm-up: F0 ...
    for (int k = 0; k < r; ++k) {                                 // F1 F0
      plan.forward(c1);
      plan.forward(c0);
    }
    for (int k = 0; k < p - r; ++k) {  // F1 I1 W1
      plan.forward(c1);
      plan.backward_input(c1);
      plan.weight(c1);
    }
    while (plan.forwards(c1) < plan.forwards(c0) || plan.forwards(c0) < m) {  // steady: F0 I0 W0 F1 I1 W1
      if (plan.forwards(c0) < m) plan.forward(c0);
      plan.backward_input(c0);
      plan.weight(c0);
      plan.forward(c1);
      plan.backward_input(c1);
      plan.weight(c1);
    }
    for (int k = 0; k < r; ++k) {  // cool-down: I0 I1
      plan.backward_input(c0);
      plan.backward_input(c1);
    }
    for (int k = 0; k < p - r; ++k) {  // I0 W0
      plan.backward_input(c0);
      plan.weight(c0);
    }
    plan.all_weights(c1);  // the pending W1's, then W0's
    plan.all_weights(c0);
  });
}

Schedule make_dualpipev(int ranks, int microbatches) {
  require_v_shape("dualpipev", ranks, microbatches);
  const int p = ranks;
  const int m = microbatches;
  return build("dualpipev", p, 2 * p, m, Placement::kV, [&](RankPlan& plan, int r) {
    const int c0 = r;               // chunk 0: stage r
    const int c1 = 2 * p - 1 - r;  // chunk 1: stage 2p - 1 - r
    // An overlapped F&B: F of one chunk, then B of the other (see the header).
    auto forward_and_backward = [&](int forward_chunk, int backward_chunk) {
      plan.forward(forward_chunk);
      plan.backward(backward_chunk);
    };
    // Phase 1: nF0.
    for (int k = 0; k < (p - r - 1) * 2; ++k) plan.forward(c0);
    // Phase 2: nF0F1.
    for (int k = 0; k < r + 1; ++k) {
      plan.forward(c0);
      plan.forward(c1);
    }
    // Phase 3: nI1W1F1 (zero bubble: the W fills the wait for the next F).
    for (int k = 0; k < p - r - 1; ++k) {
      plan.backward_input(c1);
      plan.weight();
      plan.forward(c1);
    }
    // Phase 4 (main): n(F0&B1)(F1&B0).
    for (int k = 0; k < m - 2 * p + r + 1; ++k) {
      forward_and_backward(c0, c1);
      forward_and_backward(c1, c0);
    }
    // Phase 5: nB1(F1&B0).
    for (int k = 0; k < p - r - 1; ++k) {
      plan.backward(c1);
      forward_and_backward(c1, c0);
    }
    // Phase 6: nB1B0; from the middle on, the backwards split off their W.
    bool split = false;
    for (int k = 0; k < r + 1; ++k) {
      if (k == (r + 1) / 2 && r % 2 == 1) split = true;
      plan.backward_maybe_split(c1, split);
      if (k == (r + 1) / 2 && r % 2 == 0) split = true;
      plan.backward_maybe_split(c0, split);
    }
    // Phase 7: nWI0.
    for (int k = 0; k < p - r - 1; ++k) {
      plan.weight();
      plan.backward_maybe_split(c0, split);
    }
    // Phase 8: nW.
    plan.all_weights();
  });
}

Schedule make_inference(int ranks, int microbatches) {
  require_basics("inference", ranks, microbatches);
  Schedule schedule = build("inference", ranks, ranks, microbatches, Placement::kLoop, [&](RankPlan& plan, int r) {
    for (int k = 0; k < microbatches; ++k) plan.forward(r);
  });
  schedule.set_inference(true);
  return schedule;
}

const std::vector<ScheduleInfo>& list_schedules() {
  static const std::vector<ScheduleInfo> kSchedules = {
      {.name = "gpipe",
       .description = "all forwards, then all backwards (fill-drain)",
       .constraints = "any stages, microbatches >= 1",
       .source = "Huang et al. 2019, GPipe; PyTorch ScheduleGPipe",
       .require = require_basics,
       .generate = [](int p, int m, int) { return make_gpipe(p, m); }},
      {.name = "1f1b",
       .description = "PipeDream-Flush: warm-up forwards, then one forward and one backward",
       .constraints = "microbatches >= stages",
       .source = "Narayanan et al. 2021 (PipeDream-Flush); Megatron-LM; PyTorch Schedule1F1B",
       .require = require_microbatches_at_least_stages,
       .generate = [](int p, int m, int) { return make_1f1b(p, m); }},
      {.name = "interleaved-1f1b",
       .description = "Megatron interleaved 1F1B: v chunks per rank, micro-batch groups depth-first",
       .constraints = "virtual >= 1, microbatches >= stages (micro-batch group g in [stages, microbatches] with "
                      "microbatches % g == 0 or >= stages; the smallest such g)",
       .source = "Narayanan et al. 2021 §2.2.2; Megatron-core forward_backward_pipelining_with_interleaving",
       .takes_virtual = true,
       .require = require_interleaved,
       .generate = [](int p, int m, int v) { return make_interleaved_1f1b(p, m, v); }},
      {.name = "looped-bfs",
       .description = "breadth-first: every micro-batch through one chunk before the next",
       .constraints = "virtual >= 1",
       .source = "Lamy-Poirier 2023, Breadth-First Pipeline Parallelism; PyTorch ScheduleLoopedBFS",
       .takes_virtual = true,
       .require = require_looped,
       .generate = make_looped_bfs},
      {.name = "zb-h1",
       .description = "zero bubble H1: 1F1B with W deferred into the bubbles, 1F1B's memory",
       .constraints = "microbatches >= stages",
       .source = "Qi et al. 2023, Zero Bubble Pipeline Parallelism (ZB-H1)",
       .require = require_microbatches_at_least_stages,
       .generate = [](int p, int m, int) { return make_zb_h1(p, m); }},
      {.name = "zb-h2",
       .description = "zero bubble H2: extra warm-up forwards, W's reordered into a parallelogram",
       .constraints = "microbatches >= stages (no bubble from 2 * stages - 1)",
       .source = "Qi et al. 2023, Zero Bubble Pipeline Parallelism (ZB-H2)",
       .require = require_microbatches_at_least_stages,
       .generate = [](int p, int m, int) { return make_zb_h2(p, m); }},
      {.name = "zbv",
       .description = "zero bubble V: 2 chunks per rank in V placement, 1F1B's memory",
       .constraints = "microbatches >= 2 * stages; 2 chunks per rank",
       .source = "Qi et al. 2023 §6; sail-sg/zero-bubble-pipeline-parallelism; PyTorch ScheduleZBVZeroBubble",
       .placement = Placement::kV,
       .require = require_v_shape,
       .generate = [](int p, int m, int) { return make_zbv(p, m); }},
      {.name = "dualpipev",
       .description = "DualPipeV: V placement, forward of one chunk overlapped with backward of the other",
       .constraints = "microbatches >= 2 * stages; 2 chunks per rank",
       .source = "deepseek-ai/DualPipe (DualPipeV), DeepSeek-V3 report; PyTorch ScheduleDualPipeV",
       .placement = Placement::kV,
       .require = require_v_shape,
       .generate = [](int p, int m, int) { return make_dualpipev(p, m); }},
      {.name = "inference",
       .description = "forward only: each micro-batch through the stages in order (generation's prefill)",
       .constraints = "any stages, microbatches >= 1; no backward, not for training",
       .source = "DeepSpeed InferenceSchedule (m + p - 1 steps)",
       .inference = true,
       .require = require_basics,
       .generate = [](int p, int m, int) { return make_inference(p, m); }},
  };
  return kSchedules;
}

void ScheduleInfo::check(int ranks, int microbatches, int chunks_per_rank) const {
  if (placement == Placement::kV && chunks_per_rank != 1 && chunks_per_rank != 2) {
    fail("{} always holds 2 chunks per rank (got virtual {}): leave virtual at 1 or 2", name, chunks_per_rank);
  }
  if (placement == Placement::kLoop && !takes_virtual && chunks_per_rank != 1) {
    fail("{} holds one stage per rank (got virtual {}): use interleaved-1f1b or looped-bfs for several chunks "
         "per rank",
         name, chunks_per_rank);
  }
  require(name, ranks, microbatches, chunks_per_rank);
}

void require_training_schedule(const ScheduleInfo& info) {
  if (info.inference) {
    fail("{} is a forward-only inference schedule, with no backward to train with: use a training schedule "
         "(gpipe, 1f1b, ...), or pipeflow generate for inference",
         info.name);
  }
}

const ScheduleInfo* find_schedule(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  const auto& known = list_schedules();
  const auto it = std::find_if(known.begin(), known.end(), [&](const ScheduleInfo& i) { return i.name == lower; });
  return it == known.end() ? nullptr : &*it;
}

std::string known_schedule_names() {
  std::string names;
  for (const ScheduleInfo& info : list_schedules()) {
    if (!names.empty()) names += ", ";
    names += info.name;
  }
  return names;
}

Schedule make_schedule(std::string_view name, int ranks, int microbatches, int chunks_per_rank) {
  const ScheduleInfo* info = find_schedule(name);
  if (info == nullptr) fail("unknown schedule {}: known schedules are {}", quoted_excerpt(name), known_schedule_names());
  info->check(ranks, microbatches, chunks_per_rank);
  return info->generate(ranks, microbatches, chunks_per_rank);
}

}  // namespace pipeflow
