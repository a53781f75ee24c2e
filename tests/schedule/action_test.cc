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

TEST(Action, EverySendPairsWithTheNeighbourStagesRecvAndBack) {
  EXPECT_EQ(partner(act(2, ActionKind::kSendForward, 5)), act(3, ActionKind::kRecvForward, 5));
  EXPECT_EQ(partner(act(3, ActionKind::kRecvForward, 5)), act(2, ActionKind::kSendForward, 5));
  EXPECT_EQ(partner(act(2, ActionKind::kSendBackward, 5)), act(1, ActionKind::kRecvBackward, 5));
  EXPECT_EQ(partner(act(1, ActionKind::kRecvBackward, 5)), act(2, ActionKind::kSendBackward, 5));
  for (ActionKind kind : {ActionKind::kSendForward, ActionKind::kRecvForward, ActionKind::kSendBackward,
                          ActionKind::kRecvBackward}) {
    EXPECT_EQ(partner(partner(act(4, kind, 1))), act(4, kind, 1)) << kind_token(kind);
  }
}

// The rule does not know the stage count: the first stage's RECV_F and SEND_B
// name stage -1 (Schedule::peer_rank reports that no such stage exists).
TEST(Action, AFirstStagePartnerNamesTheStageBeforeIt) {
  EXPECT_EQ(partner(act(0, ActionKind::kRecvForward, 0)).stage, StageId(-1));
  EXPECT_EQ(partner(act(0, ActionKind::kSendBackward, 0)).stage, StageId(-1));
}

TEST(Action, AComputeActionHasNoPartner) {
  EXPECT_EQ(testing::error_of([] { partner(act(1, ActionKind::kForward, 2)); }),
            "internal: 1F2 is a compute action and has no partner: only a SEND or RECV pairs with another action");
}

TEST(Action, ForwardsSendActivationsBackwardsSendGradientsWeightsSendNothing) {
  EXPECT_EQ(result_send(act(1, ActionKind::kForward, 2)), act(1, ActionKind::kSendForward, 2));
  EXPECT_EQ(result_send(act(1, ActionKind::kBackward, 2)), act(1, ActionKind::kSendBackward, 2));
  EXPECT_EQ(result_send(act(1, ActionKind::kBackwardInput, 2)), act(1, ActionKind::kSendBackward, 2));
  EXPECT_EQ(result_send(act(1, ActionKind::kBackwardWeight, 2)), std::nullopt);
  EXPECT_EQ(testing::error_of([] { result_send(act(1, ActionKind::kRecvForward, 2)); }),
            "internal: 1RECV_F2 is a message, not a compute action: only F, B, I and W send a result");
}

}  // namespace
}  // namespace pipeflow
