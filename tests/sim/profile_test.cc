#include "pipeflow/sim/profile.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "../support/error_of.h"
#include "pipeflow/schedule/generators.h"

namespace pipeflow {
namespace {

using testing::error_of;

const char* const kProfile = R"({
  "pipeflow_profile": 1,
  "source": "pipeflow train, steps 2-4",
  "stages": [
    {"forward_s": 0.5, "backward_s": 1.0, "output_bytes": 1000, "activation_bytes": 200, "optimizer_s": 0.25,
     "forward_working_bytes": 300, "backward_working_bytes": 50},
    {"forward_s": 0.5, "backward_s": 1.0, "backward_input_s": 0.6, "backward_weight_s": 0.4, "output_bytes": 0}
  ],
  "link": {"latency_s": 0.001, "bandwidth_bytes_per_s": 1e6}
})";

TEST(Profile, ReadsStagesAndLinkAndWritesThemBack) {
  const MeasuredProfile profile = profile_from_json(kProfile, "m.json");
  ASSERT_EQ(profile.stages.size(), 2u);
  EXPECT_EQ(profile.source, "pipeflow train, steps 2-4");
  EXPECT_DOUBLE_EQ(profile.stages[0].costs.forward_s, 0.5);
  EXPECT_DOUBLE_EQ(profile.stages[0].costs.backward_input_s, 0);
  EXPECT_TRUE(profile.stages[0].was_measured(&StageCosts::activation_bytes));
  EXPECT_DOUBLE_EQ(profile.stages[0].costs.activation_bytes, 200);
  EXPECT_FALSE(profile.stages[0].was_measured(&StageCosts::weight_gradient_bytes));
  EXPECT_DOUBLE_EQ(profile.stages[0].costs.forward_working_bytes, 300);
  EXPECT_DOUBLE_EQ(profile.stages[0].costs.backward_working_bytes, 50);
  EXPECT_DOUBLE_EQ(profile.stages[1].costs.backward_weight_s, 0.4);
  EXPECT_DOUBLE_EQ(profile.link.latency_s, 0.001);
  const std::string json = profile_to_json(profile);
  EXPECT_EQ(profile_to_json(profile_from_json(json, "again.json")), json);
}

// 1F1B on 2 ranks, m = 2: each message takes 1 ms + 1000 B at 1 MB/s = 2 ms.
// Rank 0: F0 [0, 0.5], F1 [0.5, 1]; rank 1: F0 [0.502, 1.002], B0 [1.002,
// 2.002], F1 [2.002, 2.502], B1 [2.502, 3.502]; rank 0: B0 [2.004, 3.004],
// B1 [3.504, 4.504], then its 0.25 s optimizer step. Rank 0's memory peaks
// in F1: 200 held by F0 and F1's 300 working bytes (B0 begins with 400 held
// and adds 50).
TEST(Profile, CostsFromAProfileSimulateTheMeasuredStep) {
  const MeasuredProfile profile = profile_from_json(kProfile, "m.json");
  const SimulationResult r = simulate(make_1f1b(2, 2), costs_from_profile(profile));
  EXPECT_NEAR(r.pipeline_time_s, 4.504, 1e-12);
  EXPECT_NEAR(r.step_time_s, 4.754, 1e-12);
  EXPECT_DOUBLE_EQ(r.ranks[0].activation_bytes, 500);
  EXPECT_NEAR(r.ranks[0].overlapped_comm_s, 2 * 0.002, 1e-15);
}

TEST(Profile, WithoutALinkMessagesAreFreeAndStayFreeWrittenBack) {
  MeasuredProfile profile = profile_from_json(R"({"pipeflow_profile": 1, "stages": [{"forward_s": 1,
      "backward_s": 2, "output_bytes": 64}]})", "free.json");
  EXPECT_EQ(profile.link.latency_s, 0);
  EXPECT_EQ(profile.link.seconds(64), 0);
  const std::string json = profile_to_json(profile);
  EXPECT_EQ(json.find("link"), std::string::npos) << json;
  EXPECT_EQ(profile_from_json(json, "again.json").link.seconds(1e9), 0);
}

TEST(Profile, MalformedProfilesNameTheKey) {
  EXPECT_EQ(error_of([] { profile_from_json(R"({"pipeflow_profile": 2})", "m.json"); }),
            "m.json: pipeflow_profile = 2: this pipeflow reads version 1");
  EXPECT_EQ(error_of([] { profile_from_json(R"({"pipeflow_profile": 1, "stages": []})", "m.json"); }),
            "m.json: stages = []: must be a non-empty list of stages");
  EXPECT_EQ(error_of([] {
              profile_from_json(R"({"pipeflow_profile": 1, "stages": [{"forward_s": 1, "backward_s": -2,
                                   "output_bytes": 0}], "link": {"latency_s": 0, "bandwidth_bytes_per_s": 1}})",
                                "m.json");
            }),
            "m.json stages[0]: backward_s = -2: must be a finite number in [0, 1e+06] seconds: re-measure the "
            "profile or correct the value");
  // 1e308 used to reach the simulation and come back as "a rank start time is inf".
  EXPECT_EQ(error_of([] {
              profile_from_json(R"({"pipeflow_profile": 1, "stages": [{"forward_s": 1e308, "backward_s": 2,
                                   "output_bytes": 0}]})",
                                "m.json");
            }),
            "m.json stages[0]: forward_s = 1e+308: must be a finite number in [0, 1e+06] seconds: re-measure the "
            "profile or correct the value");
  EXPECT_EQ(error_of([] {
              profile_from_json(R"({"pipeflow_profile": 1, "stages": [{"forward_s": 1, "backward_s": 2,
                                   "output_bytes": 1e300}]})",
                                "m.json");
            }),
            "m.json stages[0]: output_bytes = 1e+300: must be a finite number in [0, 1.1259e+15] bytes: re-measure "
            "the profile or correct the value");
  EXPECT_EQ(error_of([] {
              profile_from_json(R"({"pipeflow_profile": 1, "stages": [{"forward_s": 1, "backward_s": 2,
                                   "output_bytes": 0, "forwrd_s": 1}], "link": {"latency_s": 0,
                                   "bandwidth_bytes_per_s": 1}})",
                                "m.json");
            }),
            "m.json stages[0]: unknown key 'forwrd_s' (did you mean 'forward_s'?): remove it or fix its spelling");
  EXPECT_EQ(error_of([] {
              profile_from_json(R"({"pipeflow_profile": 1, "stages": [{"forward_s": 1, "backward_s": 2,
                                   "output_bytes": 0}], "link": {"bandwidth_bytes_per_s": 1}})",
                                "m.json");
            }),
            "m.json: link.latency_s is required but missing");
}

}  // namespace
}  // namespace pipeflow
