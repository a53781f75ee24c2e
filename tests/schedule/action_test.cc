#include "pipeflow/schedule/action.h"

#include <gtest/gtest.h>

#include <set>
#include <unordered_set>

#include "../support/error_of.h"
#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

Action act(int stage, ActionKind kind, int microbatch) { return {StageId(stage), kind, MicrobatchId(microbatch)}; }

std::string parse_error(std::string_view token) {
  return testing::error_of([&] { parse_action(token); });
}

TEST(Action, TextIsPyTorchsForEveryKind) {
  EXPECT_EQ(to_string(act(2, ActionKind::kForward, 0)), "2F0");
  EXPECT_EQ(to_string(act(0, ActionKind::kBackwardInput, 3)), "0I3");
  EXPECT_EQ(to_string(act(1, ActionKind::kSendForward, 4)), "1SEND_F4");
  EXPECT_EQ(to_string(act(3, ActionKind::kBackward, 12)), "3B12");
  EXPECT_EQ(to_string(act(3, ActionKind::kBackwardWeight, 1)), "3W1");
  EXPECT_EQ(to_string(act(5, ActionKind::kRecvForward, 0)), "5RECV_F0");
  EXPECT_EQ(to_string(act(5, ActionKind::kSendBackward, 7)), "5SEND_B7");
  EXPECT_EQ(to_string(act(10, ActionKind::kRecvBackward, 99)), "10RECV_B99");
  EXPECT_EQ(fmt::format("{}", act(2, ActionKind::kForward, 0)), "2F0");
}

TEST(Action, ParsingThePrintedFormGivesTheSameActionForEveryKind) {
  for (int kind = 0; kind < kNumActionKinds; ++kind) {
    for (int stage : {0, 1, 17}) {
      for (int microbatch : {0, 3, 1023}) {
        const Action a = act(stage, static_cast<ActionKind>(kind), microbatch);
        EXPECT_EQ(parse_action(to_string(a)), a) << to_string(a);
      }
    }
  }
}

TEST(Action, ParsingIgnoresSurroundingSpaces) { EXPECT_EQ(parse_action("  1SEND_B2 "), act(1, ActionKind::kSendBackward, 2)); }

TEST(Action, ErrorsNameTheToken) {
  EXPECT_EQ(parse_error("2X3"),
            "invalid action \"2X3\": unknown action type in \"X3\"; expected "
            "[stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B][micro-batch], e.g. 2F0 or 1SEND_F4");
  EXPECT_EQ(parse_error("F3"),
            "invalid action \"F3\": it does not start with a stage number; expected "
            "[stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B][micro-batch], e.g. 2F0 or 1SEND_F4");
  EXPECT_EQ(parse_error("2F"),
            "invalid action \"2F\": F needs a micro-batch index; expected "
            "[stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B][micro-batch], e.g. 2F0 or 1SEND_F4");
  EXPECT_EQ(parse_error("0UNSHARD"),
            "invalid action \"0UNSHARD\": unknown action type in \"UNSHARD\"; expected "
            "[stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B][micro-batch], e.g. 2F0 or 1SEND_F4");
  EXPECT_EQ(parse_error("2F0x"),
            "invalid action \"2F0x\": \"0x\" after F is not a micro-batch index; expected "
            "[stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B][micro-batch], e.g. 2F0 or 1SEND_F4");
  EXPECT_EQ(parse_error("7"),
            "invalid action \"7\": it has no action type; expected "
            "[stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B][micro-batch], e.g. 2F0 or 1SEND_F4");
  EXPECT_EQ(parse_error("1F99999999999"),
            "invalid action \"1F99999999999\": micro-batch 99999999999 is too large; expected "
            "[stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B][micro-batch], e.g. 2F0 or 1SEND_F4");
}

TEST(Action, OrderAndHashDistinguishEveryField) {
  const std::set<Action> ordered{act(0, ActionKind::kForward, 1), act(0, ActionKind::kForward, 0),
                                 act(0, ActionKind::kBackward, 0), act(1, ActionKind::kForward, 0)};
  EXPECT_EQ(ordered.size(), 4u);
  EXPECT_EQ(*ordered.begin(), act(0, ActionKind::kForward, 0));
  const std::unordered_set<Action> hashed(ordered.begin(), ordered.end());
  EXPECT_EQ(hashed.size(), 4u);
  EXPECT_TRUE(hashed.count(act(1, ActionKind::kForward, 0)));
}

TEST(Action, KindPredicates) {
  EXPECT_TRUE(is_compute(ActionKind::kBackwardWeight));
  EXPECT_FALSE(is_compute(ActionKind::kRecvBackward));
  EXPECT_TRUE(is_input_backward(ActionKind::kBackwardInput));
  EXPECT_FALSE(is_input_backward(ActionKind::kBackwardWeight));
  EXPECT_TRUE(is_send(ActionKind::kSendBackward));
  EXPECT_TRUE(is_recv(ActionKind::kRecvForward));
}

}  // namespace
}  // namespace pipeflow
