#include "pipeflow/config/run_keys.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>

#include "../support/error_of.h"
#include "../support/run_key_examples.h"
#include "pipeflow/config/run_config.h"

namespace pipeflow {
namespace {

using testing::at_path;
using testing::error_of;
using testing::run_key_examples;

nlohmann::json written(const RunConfig& run) { return nlohmann::json::parse(run_config_to_json(run)); }

// The leaves of a written configuration: a row's path ends the walk (an
// inline model and a list are one value).
void leaves(const nlohmann::json& node, const std::string& prefix, std::set<std::string>& out) {
  for (const auto& [key, value] : node.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (find_run_key(path) == nullptr && value.is_object()) {
      leaves(value, path, out);
    } else {
      out.insert(path);
    }
  }
}

TEST(RunKeys, EveryRowHasAnExampleAndPathsAndFlagsAreUnique) {
  std::set<std::string> examples;
  for (const auto& example : run_key_examples()) examples.insert(example.path);
  std::set<std::string_view> paths, flags;
  for (const RunKey& key : run_keys()) {
    EXPECT_TRUE(examples.contains(std::string(key.path)))
        << key.path << ": add an example to tests/support/run_key_examples.h";
    EXPECT_TRUE(paths.insert(key.path).second) << key.path;
    EXPECT_EQ(find_run_key(key.path), &key);
    EXPECT_FALSE(key.help.empty()) << key.path;
    EXPECT_FALSE(key.rule.empty()) << key.path;
    if (!key.fallback.empty()) {
      EXPECT_FALSE(nlohmann::json::parse(key.fallback, nullptr, false).is_discarded()) << key.path;
    }
    if (key.flag.empty()) {
      EXPECT_EQ(key.scope, FlagScope::kNone) << key.path;
      EXPECT_FALSE(key.vary) << key.path;
      continue;
    }
    EXPECT_NE(key.scope, FlagScope::kNone) << key.path;
    EXPECT_TRUE(flags.insert(key.flag).second) << key.flag;
    EXPECT_EQ(find_run_flag(key.flag), &key);
  }
  for (const std::string& path : examples) EXPECT_NE(find_run_key(path), nullptr) << path << ": no such row";
}

// The defaults of the table are those parse_run_config gives and
// run_config_to_json writes; every key written is a row.
TEST(RunKeys, TheDefaultsAreWhatTheParserGivesAndTheWriterWrites) {
  const nlohmann::json json = written(default_run_config());
  for (const RunKey& key : run_keys()) {
    const nlohmann::json* value = at_path(json, std::string(key.path));
    if (key.fallback.empty()) {
      EXPECT_EQ(value, nullptr) << key.path << " is written, but its row says it is absent by default";
    } else {
      ASSERT_NE(value, nullptr) << key.path << " is not written by run_config_to_json";
      EXPECT_EQ(*value, nlohmann::json::parse(key.fallback)) << key.path;
    }
  }
}

// Each example, set as the command line sets it (over the defaults, with
// its context), is read, checked and written back at its path; the written
// file reads back to the same file; every key written is a row.
TEST(RunKeys, EveryKeyRoundTripsFromTheCommandLineThroughTheWrittenFile) {
  for (const auto& example : run_key_examples()) {
    SCOPED_TRACE(example.path);
    const RunKey& key = *find_run_key(example.path);
    RunOverrides o;
    for (const auto& [path, value] : example.context) o.set(path, value);
    o.set_text(key, testing::as_typed(example.value), "--key");  // typed, as a flag or --vary gives it
    EXPECT_EQ(*o.find(example.path), example.value);
    const RunConfig run = default_run_config(o);
    const nlohmann::json json = written(run);
    const std::string path = example.written_path.empty() ? example.path : example.written_path;
    const nlohmann::json& expected = example.written_path.empty() ? example.value : example.written_value;
    const nlohmann::json* value = at_path(json, path);
    if (expected.is_null()) {
      EXPECT_EQ(value, nullptr);  // accepted, not kept
    } else {
      ASSERT_NE(value, nullptr);
      EXPECT_EQ(*value, expected);
    }
    EXPECT_NE(nlohmann::json(example.value).dump(), key.fallback) << "an example must differ from the default";
    const RunConfig again = parse_run_config(Config::from_json(json, "written.json"));
    EXPECT_EQ(run_config_to_json(again), run_config_to_json(run));
    std::set<std::string> paths;
    leaves(json, "", paths);
    for (const std::string& leaf : paths) EXPECT_NE(find_run_key(leaf), nullptr) << leaf << " is written but no row";
  }
}

TEST(RunKeys, ATypedValueIsCheckedAgainstTheKeysType) {
  EXPECT_EQ(error_of([] { run_key_value(*find_run_flag("--pp"), "two", "--pp"); }),
            "--pp \"two\": must be an integer (key pipeline.stages: >= 1)");
  EXPECT_EQ(error_of([] { run_key_value(*find_run_key("gradient_clipping"), "1.0x", "--vary gradient_clipping"); }),
            "--vary gradient_clipping \"1.0x\": must be a number (key gradient_clipping: >= 0)");
  EXPECT_EQ(error_of([] { run_key_value(*find_run_key("sequence_parallel"), "yes", "--vary sequence-parallel"); }),
            "--vary sequence-parallel \"yes\": must be true or false (key sequence_parallel: true | false)");
  // The model's flag takes a preset or path as text and its keys inline
  // (from its first "{", spaces before it allowed).
  const RunKey& model = *find_run_flag("--model");
  EXPECT_EQ(run_key_value(model, "gpt-tiny", "--model"), "gpt-tiny");
  EXPECT_EQ(run_key_value(model, R"({"n_layer": 2, "n_head": 2})", "--model"),
            nlohmann::json({{"n_layer", 2}, {"n_head", 2}}));
  EXPECT_EQ(run_key_value(model, R"( {"n_layer": 2})", "--model"), nlohmann::json({{"n_layer", 2}}));
  EXPECT_EQ(error_of([&] { run_key_value(model, R"({"n_layer": 2,)", "--model"); }),
            "--model \"{\\x22n_layer\\x22: 2,\": begins with \"{\" but is not a JSON object: parse error at line 1, "
            "column 15: syntax error while parsing object key - unexpected end of input; expected string literal "
            "(key model: a preset, a config.json path, {n_layer, n_head, n_embd, n_ctx, vocab_size}, or a "
            "config.json's keys)");
  EXPECT_EQ(error_of([] { RunOverrides().set("pipeline.speed", 1); }),
            "pipeline.speed: no key of the run configuration has this path");
  // A flag is checked as its key in a file.
  RunOverrides zero;
  zero.set_text(*find_run_flag("--stages"), "0", "--stages");
  EXPECT_EQ(error_of([&] { default_run_config(zero); }),
            "the command line: pipeline.stages = 0: must be a positive integer: the number of pipeline ranks");
}

}  // namespace
}  // namespace pipeflow
