#include "pipeflow/core/config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"
#include "../support/error_of.h"

namespace pipeflow {
namespace {

using testing::error_of;

TEST(Config, ReadsNestedValuesAndFallbacks) {
  const Config config = Config::parse(
      R"({"train_batch_size": 64, "pipeline": {"stages": 4, "schedule": "1f1b"}, "lr": 3e-4})", "c.json");
  EXPECT_EQ(config.require<int>("train_batch_size"), 64);
  EXPECT_DOUBLE_EQ(config.get("lr", 1.0), 3e-4);
  const Config pipeline = config.object("pipeline");
  EXPECT_EQ(pipeline.get("stages", 1), 4);
  EXPECT_EQ(pipeline.get("schedule", "gpipe"), "1f1b");
  EXPECT_EQ(pipeline.get("virtual_stages", 1), 1);
  EXPECT_EQ(pipeline.path("stages"), "pipeline.stages");
  EXPECT_EQ(pipeline.source(), "c.json");
  config.check_no_unknown_keys();
}

TEST(Config, WrongTypeNamesThePathAndTheValue) {
  const Config config = Config::parse(R"({"pipeline": {"stages": "four"}})", "c.json");
  EXPECT_EQ(error_of([&] { config.object("pipeline").get("stages", 1); }),
            "c.json: pipeline.stages must be an integer, got \"four\"");
}

TEST(Config, IntegralFloatIsAnInteger) {
  const Config config = Config::parse(R"({"steps": 1e3, "bad": 2.5})", "c.json");
  EXPECT_EQ(config.get("steps", 0), 1000);
  EXPECT_EQ(error_of([&] { config.get("bad", 0); }), "c.json: bad must be an integer, got 2.5");
}

TEST(Config, MissingRequiredKeyIsNamed) {
  const Config config = Config::parse(R"({})", "c.json");
  EXPECT_EQ(error_of([&] { config.require<std::string>("model"); }), "c.json: model is required but missing");
}

TEST(Config, UnknownKeysAreListedWithSuggestions) {
  const Config config = Config::parse(R"({"pipeline": {"stagse": 4}, "zzz": 1, "steps": 2})", "c.json");
  config.get("steps", 0);
  config.object("pipeline").get("stages", 1);
  EXPECT_EQ(error_of([&] { config.check_no_unknown_keys(); }),
            "c.json: unknown keys 'pipeline.stagse' (did you mean 'pipeline.stages'?), 'zzz': "
            "remove it or fix its spelling");
}

TEST(Config, IsObjectTellsAnObjectFromAPlainValueAndKeepsCheckingBelowIt) {
  const Config config = Config::parse(R"({"model": {"n_layer": 2, "n_lyer": 3}, "name": "gpt2"})", "c.json");
  EXPECT_TRUE(config.is_object("model"));
  EXPECT_FALSE(config.is_object("name"));
  EXPECT_FALSE(config.is_object("absent"));
  EXPECT_EQ(config.get("name", ""), "gpt2");
  EXPECT_EQ(config.object("model").get("n_layer", 0), 2);
  EXPECT_EQ(error_of([&] { config.check_no_unknown_keys(); }),
            "c.json: unknown key 'model.n_lyer' (did you mean 'model.n_layer'?): remove it or fix its spelling");
}

TEST(Config, RawTakesAWholeSubtree) {
  const Config config = Config::parse(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1}}})", "c.json");
  EXPECT_EQ(config.raw("optimizer")["params"]["lr"], 1);
  config.check_no_unknown_keys();
}

TEST(Config, FailValueStatesTheRule) {
  const Config config = Config::parse(R"({"steps": 0})", "c.json");
  EXPECT_EQ(error_of([&] { config.fail_value("steps", "must be >= 1"); }), "c.json: steps = 0: must be >= 1");
}

TEST(Config, ListsAreChecked) {
  const Config config = Config::parse(R"({"parts": [1, 2, 3], "bad": [1, "x"]})", "c.json");
  EXPECT_EQ(config.get("parts", std::vector<int>{}), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(error_of([&] { config.get("bad", std::vector<int>{}); }), "c.json: bad must be an integer, got [1,\"x\"]");
}

TEST(Config, InvalidJsonIsReported) {
  EXPECT_NE(error_of([] { Config::parse("{", "c.json"); }).find("c.json: not valid JSON"), std::string::npos);
  // A number beyond double's range is nlohmann's out_of_range, not a parse_error (was "internal error").
  EXPECT_EQ(error_of([] { Config::parse(R"({"peak": 1e400})", "h.json"); }),
            "h.json: not valid JSON: number overflow parsing \"1e400\"");
  EXPECT_EQ(error_of([] { Config::parse("[1]", "c.json"); }),
            "c.json: a configuration must be a JSON object, got [1]");
}

}  // namespace
}  // namespace pipeflow
