// The flags of the commands that read a run configuration come from one
// table (config/run_keys.h): each is in the help of the commands its row
// names, and reaches the configuration the command writes.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <string>

#include "../support/run_key_examples.h"
#include "pipeflow/config/run_keys.h"
#include "pipeflow/core/file.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

bool takes(std::string_view command, FlagScope scope) {
  if (scope == FlagScope::kNone) return false;
  if (command == "train") return true;
  if (command == "sweep") return scope == FlagScope::kAll || scope == FlagScope::kTraining;
  return scope == FlagScope::kAll;
}

TEST(RunKeysCommand, EveryFlagIsInTheHelpOfTheCommandsItsRowNames) {
  for (const char* command : {"train", "simulate", "sweep"}) {
    const CommandResult help = run_pipeflow(std::string(command) + " --help");
    ASSERT_EQ(help.exit_code, 0) << help.err;
    for (const RunKey& key : run_keys()) {
      if (key.flag.empty()) continue;
      const std::string line = fmt::format("  {}{}{} ", key.flag, key.aliases.empty() ? "" : ",", key.aliases);
      if (takes(command, key.scope)) {
        EXPECT_NE(help.out.find(line), std::string::npos) << command << " lacks " << key.flag << "\n" << help.out;
        EXPECT_NE(help.out.find(fmt::format("(key: {};", key.path)), std::string::npos) << command << " " << key.path;
      } else {
        EXPECT_EQ(help.out.find(line), std::string::npos) << command << " has " << key.flag;
      }
    }
  }
}

// A value as one word of a shell command line: JSON lists and objects
// (--freeze ["embedding"]) keep their quotes.
std::string shell_word(const std::string& text) { return "'" + text + "'"; }

// Every flag simulate takes, with its example value, is the key in the
// configuration simulate keeps in its trace.
TEST(RunKeysCommand, EveryFlagOfSimulateReachesTheConfigurationInItsTrace) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/base.json", R"({"model": "gpt-tiny", "gradient_accumulation_steps": 4})");
  for (const RunKeyExample& example : run_key_examples()) {
    const RunKey& key = *find_run_key(example.path);
    if (key.scope != FlagScope::kAll) continue;
    SCOPED_TRACE(example.path);
    std::string arguments = "simulate --config base.json --trace trace.json";
    for (const auto& [path, value] : example.context) {
      arguments += fmt::format(" {} {}", find_run_key(path)->flag, shell_word(as_typed(value)));
    }
    arguments += " " + std::string(key.flag);
    if (key.type != KeyType::kBoolean) arguments += " " + shell_word(as_typed(example.value));
    const CommandResult r = run_pipeflow(arguments, dir);
    ASSERT_EQ(r.exit_code, 0) << arguments << "\n" << r.err;
    const nlohmann::json trace = nlohmann::json::parse(read_file(dir + "/trace.json"));
    const nlohmann::json* value = at_path(trace["otherData"]["pipeflow"]["config"], example.path);
    ASSERT_NE(value, nullptr) << arguments;
    EXPECT_EQ(*value, example.value) << arguments;
  }
}

// The flags of training runs (steps, out_dir, checkpoint.load) are the keys
// of the run_config.json a run writes beside its outputs.
TEST(RunKeysCommand, TheTrainingFlagsAreTheKeysWrittenBesideTheRun) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/run.json", R"({"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_ctx": 16},
    "gradient_accumulation_steps": 2, "pipeline": {"stages": 2}, "eval_interval": 0,
    "checkpoint": {"interval": 1}})");
  const CommandResult first = run_pipeflow("train --config run.json --steps 1 --out-dir first", dir);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const CommandResult second = run_pipeflow("train --config run.json --steps 2 --out-dir second --resume first", dir);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const nlohmann::json written = nlohmann::json::parse(read_file(dir + "/second/run_config.json"));
  EXPECT_EQ(written["steps"], 2);
  EXPECT_EQ(written["out_dir"], "second");
  EXPECT_EQ(written["checkpoint"]["load"], "first");
}

// plan --write-config writes every key of the table with its value (the
// layout's, else the default) and nothing that is not a key.
TEST(RunKeysCommand, PlansConfigurationHoldsEveryKeyOfTheTable) {
  const std::string dir = make_temp_dir();
  const CommandResult r =
      run_pipeflow("plan --model gpt2-124m --hardware a100-80g --devices 4 --global-batch 16 --seq 1024 "
                   "--write-config best.json",
                   dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json written = nlohmann::json::parse(read_file(dir + "/best.json"));
  for (const RunKey& key : run_keys()) {
    const bool absent_by_default = key.fallback.empty();
    const bool set_by_plan = key.path == "train_batch_size" || key.path == "train_micro_batch_size_per_gpu" ||
                             key.path == "devices" || key.path == "recompute" || key.path == "model";
    if (absent_by_default && !set_by_plan) {
      EXPECT_EQ(at_path(written, std::string(key.path)), nullptr) << key.path;
    } else {
      EXPECT_NE(at_path(written, std::string(key.path)), nullptr) << key.path << " missing from\n" << written.dump(2);
    }
  }
  const CommandResult simulated = run_pipeflow("simulate --config best.json", dir);
  EXPECT_EQ(simulated.exit_code, 0) << simulated.err;
}

}  // namespace
}  // namespace pipeflow::testing
