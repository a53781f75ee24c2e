#include "pipeflow/schedule/action.h"

#include <array>
#include <cctype>
#include <charconv>
#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/core/text.h"

namespace pipeflow {
namespace {

// Longest tokens first so that "SEND_F" is not read as a shorter token.
constexpr std::array<std::pair<std::string_view, ActionKind>, kNumActionKinds> kTokens{{
    {"SEND_F", ActionKind::kSendForward},
    {"RECV_F", ActionKind::kRecvForward},
    {"SEND_B", ActionKind::kSendBackward},
    {"RECV_B", ActionKind::kRecvBackward},
    {"F", ActionKind::kForward},
    {"B", ActionKind::kBackward},
    {"I", ActionKind::kBackwardInput},
    {"W", ActionKind::kBackwardWeight},
}};

std::size_t digits_at_front(std::string_view text) {
  std::size_t n = 0;
  while (n < text.size() && std::isdigit(static_cast<unsigned char>(text[n]))) ++n;
  return n;
}

[[noreturn]] void fail_token(std::string_view token, std::string_view why) {
  fail("invalid action \"{}\": {}; expected [stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B][micro-batch], "
       "e.g. 2F0 or 1SEND_F4",
       token, why);
}

int parse_index(std::string_view token, std::string_view digits, std::string_view what) {
  int value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc() || end != digits.data() + digits.size()) {
    fail_token(token, fmt::format("{} {} is too large", what, digits));
  }
  return value;
}

}  // namespace

std::string_view kind_token(ActionKind kind) {
  for (const auto& [token, k] : kTokens) {
    if (k == kind) return token;
  }
  fail("internal: unknown action kind {}", static_cast<int>(kind));
}

std::string to_string(const Action& action) {
  return fmt::format("{}{}{}", action.stage.value(), kind_token(action.kind), action.microbatch.value());
}

Action partner(const Action& message) {
  const MicrobatchId mb = message.microbatch;
  const int s = message.stage.value();
  switch (message.kind) {
    case ActionKind::kSendForward:
      return {StageId(s + 1), ActionKind::kRecvForward, mb};
    case ActionKind::kRecvForward:
      return {StageId(s - 1), ActionKind::kSendForward, mb};
    case ActionKind::kSendBackward:
      return {StageId(s - 1), ActionKind::kRecvBackward, mb};
    case ActionKind::kRecvBackward:
      return {StageId(s + 1), ActionKind::kSendBackward, mb};
    default:
      fail("internal: {} is a compute action and has no partner: only a SEND or RECV pairs with another action",
           message);
  }
}

std::optional<Action> result_send(const Action& compute) {
  switch (compute.kind) {
    case ActionKind::kForward:
      return Action{compute.stage, ActionKind::kSendForward, compute.microbatch};
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      return Action{compute.stage, ActionKind::kSendBackward, compute.microbatch};
    case ActionKind::kBackwardWeight:
      return std::nullopt;
    default:
      fail("internal: {} is a message, not a compute action: only F, B, I and W send a result", compute);
  }
}

Action parse_action(std::string_view text) {
  const std::string_view token = trim(text);
  const std::size_t stage_digits = digits_at_front(token);
  if (stage_digits == 0) fail_token(token, "it does not start with a stage number");
  std::string_view rest = token.substr(stage_digits);
  for (const auto& [kind_text, kind] : kTokens) {
    if (!rest.starts_with(kind_text)) continue;
    const std::string_view microbatch = rest.substr(kind_text.size());
    if (microbatch.empty()) {
      fail_token(token, fmt::format("{} needs a micro-batch index", kind_text));
    }
    if (digits_at_front(microbatch) != microbatch.size()) {
      fail_token(token, fmt::format("\"{}\" after {} is not a micro-batch index", microbatch, kind_text));
    }
    return Action{StageId(parse_index(token, token.substr(0, stage_digits), "stage")), kind,
                  MicrobatchId(parse_index(token, microbatch, "micro-batch"))};
  }
  fail_token(token, rest.empty() ? std::string("it has no action type")
                                 : fmt::format("unknown action type in \"{}\"", rest));
}

std::optional<Action> action_named(std::string_view name) {
  if (name.empty() || name.front() < '0' || name.front() > '9') return std::nullopt;
  try {
    return parse_action(name);
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace pipeflow
