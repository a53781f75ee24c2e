#pragma once

#include <fmt/format.h>

#include <compare>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "pipeflow/core/ids.h"

namespace pipeflow {

// What one entry of a rank's action list does. The compute kinds are F
// (forward of one micro-batch through one stage), B (its full backward), and
// the zero-bubble split of B into I (gradient for the stage's input) and W
// (gradient for its weights). The communication kinds follow PyTorch's
// torch.distributed.pipelining convention (schedules.py, _add_send_recv):
//   sSEND_Fm  on the rank of stage s: sends s's forward output to stage s+1;
//   sRECV_Fm  on the rank of stage s: receives s's input from stage s-1;
//   sSEND_Bm  on the rank of stage s: sends s's input gradient to stage s-1;
//   sRECV_Bm  on the rank of stage s: receives s's output gradient from s+1.
enum class ActionKind {
  kForward,
  kBackward,
  kBackwardInput,
  kBackwardWeight,
  kSendForward,
  kRecvForward,
  kSendBackward,
  kRecvBackward,
};

inline constexpr int kNumActionKinds = 8;

// One action: stage (global, virtual stage index), kind, micro-batch.
// Ordered and hashed so that actions can key maps and sets.
struct Action {
  StageId stage;
  ActionKind kind = ActionKind::kForward;
  MicrobatchId microbatch;

  auto operator<=>(const Action&) const = default;
};

// PyTorch's token for a kind: "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B".
std::string_view kind_token(ActionKind kind);

constexpr bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight;
}
constexpr bool is_communication(ActionKind kind) { return !is_compute(kind); }
// B or I: the backward that produces the gradient for the stage's input.
constexpr bool is_input_backward(ActionKind kind) {
  return kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput;
}
constexpr bool is_send(ActionKind kind) {
  return kind == ActionKind::kSendForward || kind == ActionKind::kSendBackward;
}
constexpr bool is_recv(ActionKind kind) {
  return kind == ActionKind::kRecvForward || kind == ActionKind::kRecvBackward;
}

// The other half of a message, PyTorch's pairing (_add_send_recv):
//   SEND_F s m <-> RECV_F s+1 m   (the activation of s goes forward),
//   SEND_B s m <-> RECV_B s-1 m   (the input gradient of s goes back).
// Precondition: `message` is a SEND or RECV; a compute action has no partner
// and throws an internal Error. The rule alone cannot know the stage count,
// so the partner names stage s+1 or s-1 even where no such stage exists
// (RECV_F and SEND_B of stage 0 name stage -1; SEND_F and RECV_B of the last
// stage name one past it): Schedule::peer_rank says whether it exists.
Action partner(const Action& message);

// The SEND that carries a compute action's result to its neighbouring stage:
// F s m -> SEND_F s m (the activation), B or I s m -> SEND_B s m (the input
// gradient); none for W, whose result stays on its stage. Whether that
// neighbour exists and sits on another rank is the schedule's to say
// (Schedule::peer_rank). Precondition: `compute` is F, B, I or W.
std::optional<Action> result_send(const Action& compute);

// Exactly PyTorch's text: stage, kind token, micro-batch ("2F0", "0I3", "1SEND_F4").
std::string to_string(const Action& action);

// The inverse of to_string. Accepts the whole token only (PyTorch's regex
// `(\d+)(F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)`, anchored at both ends;
// surrounding spaces are ignored). PyTorch writes an empty micro-batch only
// for its per-stage actions (UNSHARD, RESHARD, REDUCE_GRAD), and its runtime
// rejects an F/B/I/W/SEND/RECV without one ("missing mb_index"), so an empty
// micro-batch is an error here too. Errors are pipeflow::Error naming the token.
Action parse_action(std::string_view token);

// The action `name` is in that text form, if it is one (a label of another
// program's trace: "0F1", "1SEND_B0"); none for any other name.
std::optional<Action> action_named(std::string_view name);

}  // namespace pipeflow

template <>
struct std::hash<pipeflow::Action> {
  std::size_t operator()(const pipeflow::Action& action) const noexcept {
    const std::size_t key = (static_cast<std::size_t>(action.stage.value()) * pipeflow::kNumActionKinds +
                             static_cast<std::size_t>(action.kind)) *
                                1000003u +
                            static_cast<std::size_t>(action.microbatch.value());
    return std::hash<std::size_t>{}(key);
  }
};

template <>
struct fmt::formatter<pipeflow::Action> : fmt::formatter<std::string_view> {
  auto format(const pipeflow::Action& action, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(pipeflow::to_string(action), ctx);
  }
};
