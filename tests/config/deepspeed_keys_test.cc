// DeepSpeed's configuration as users write it: every documented key read,
// "auto", the spellings of PipelineModule's arguments, YAML.
#include "pipeflow/config/deepspeed_keys.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "pipeflow/config/run_config.h"
#include "pipeflow/config/run_keys.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"
#include "../support/temp_dir.h"

namespace pipeflow {
namespace {

using Json = nlohmann::json;

const Json kModel = {{"n_layer", 4}, {"n_head", 2}, {"n_embd", 64}, {"n_ctx", 32}};

RunConfig parse(Json json) {
  if (!json.contains("model")) json["model"] = kModel;
  return parse_run_config(Config::from_json(std::move(json), "ds.json"));
}

std::string error_of(Json json) {
  try {
    parse(std::move(json));
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// Whether `path` is a key pipeflow models, or an object holding one.
bool modelled(const std::string& path) {
  for (const RunKey& key : run_keys()) {
    const std::string k(key.path);
    if (k == path || k.starts_with(path + ".")) return true;
  }
  return path == "optimizer.params" || path == "scheduler.params" || path == "scheduler.type" ||
         path == "optimizer.type";
}

// The table entry that covers `path` (the path itself or an object above it).
const DeepSpeedKey* covering(const std::string& path) {
  for (const DeepSpeedKey& key : deepspeed_keys_not_modelled()) {
    const std::string k(key.path);
    if (k == path || path.starts_with(k + ".")) return &key;
  }
  return nullptr;
}

Json at_path(const std::string& path, Json value) {
  Json json = Json::object();
  Json* at = &json;
  std::size_t begin = 0;
  for (std::size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', begin)) {
    at = &(*at)[path.substr(begin, dot - begin)];
    begin = dot + 1;
  }
  (*at)[path.substr(begin)] = std::move(value);
  return json;
}

TEST(DeepSpeedKeys, EveryKeyOfDeepSpeedsReferenceIsModelledOrReadAndListed) {
  // tests/data/deepspeed/documented_keys.txt: the key paths of DeepSpeed's configuration reference
  // (docs/_pages/config-json.md), names the user chooses written <group_name> / <metric_name>.
  std::ifstream in(std::string(PIPEFLOW_SOURCE_DIR) + "/tests/data/deepspeed/documented_keys.txt");
  std::string path;
  int walked = 0, listed = 0;
  while (std::getline(in, path)) {
    ++walked;
    for (const auto& [placeholder, name] : {std::pair{"<group_name>", "g1"}, std::pair{"<metric_name>", "m1"}}) {
      for (std::size_t at = path.find(placeholder); at != std::string::npos; at = path.find(placeholder)) {
        path.replace(at, std::string(placeholder).size(), name);
      }
    }
    if (modelled(path)) continue;
    const DeepSpeedKey* key = covering(path);
    ASSERT_NE(key, nullptr) << path << ": neither modelled nor in deepspeed_keys_not_modelled()";
    // Read in a configuration: no "unknown key", and listed once with its use.
    RunConfig run;
    ASSERT_NO_THROW(run = parse(at_path(path, 1))) << path << ": " << error_of(at_path(path, 1));
    ASSERT_EQ(run.not_modelled.size(), 1u) << path;
    EXPECT_EQ(run.not_modelled[0], fmt::format("{} ({})", key->path, key->use));
    ++listed;
  }
  EXPECT_GT(walked, 250);  // the whole reference, not an empty file
  EXPECT_GT(listed, 200);
}

TEST(DeepSpeedKeys, AMisspeltDeepSpeedKeyIsStillAnErrorWithDidYouMean) {
  const std::string error = error_of(Json::parse(R"({"zero_optimization": {"overlap_com": true}})"));
  EXPECT_NE(error.find("unknown key 'zero_optimization.overlap_com' (did you mean 'zero_optimization.overlap_comm'?)"),
            std::string::npos)
      << error;
  EXPECT_NE(error_of(Json::parse(R"({"flops_profilr": {}})")).find("unknown key 'flops_profilr'"), std::string::npos);
}

TEST(DeepSpeedKeys, AutoResolvesAsHuggingFacesTrainerDoes) {
  const RunConfig run = parse(Json::parse(R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                  "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "bf16": {"enabled": "auto"}, "steps": 40,
    "zero_optimization": {"stage": 1, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}})"));
  EXPECT_EQ(run.batch_keys.micro_batch, 8);
  EXPECT_EQ(run.batch_keys.gradient_accumulation_steps, 1);
  EXPECT_FALSE(run.batch_keys.train_batch_size);
  EXPECT_DOUBLE_EQ(run.gradient_clipping, 1.0);
  EXPECT_DOUBLE_EQ(run.optimizer.lr, 5e-5);
  EXPECT_DOUBLE_EQ(run.optimizer.betas[1], 0.999);
  EXPECT_DOUBLE_EQ(run.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(run.optimizer.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(run.scheduler.warmup_max_lr, 5e-5);
  EXPECT_EQ(run.scheduler.warmup_num_steps, 0);
  EXPECT_EQ(run.scheduler.total_num_steps, 40);
  EXPECT_EQ(run.reduce_bucket_size, 64 * 64);  // the model's width squared
  // A not-modelled key may stay "auto"; each resolution is said.
  EXPECT_EQ(run.not_modelled.size(), 1u);
  EXPECT_GE(run.warnings.size(), 12u);
}

TEST(DeepSpeedKeys, PipelineModulesArgumentsAsCoursesSpellThemAreReadWithAWarning) {
  const RunConfig run = parse(Json::parse(R"({"num_stages": 2, "pipe_partition_method": "uniform",
                                              "pipeline": {"activation_checkpointing": true}})"));
  EXPECT_EQ(run.pipeline.ranks, 2);
  EXPECT_EQ(run.pipeline.partition_method.kind, PartitionMethod::Kind::kUniform);
  EXPECT_EQ(run.pipeline.recompute_interval, 1);
  ASSERT_EQ(run.warnings.size(), 3u);
  EXPECT_NE(run.warnings[0].find("num_stages read as pipeline.stages (DeepSpeed's PipelineModule(num_stages=...))"),
            std::string::npos)
      << run.warnings[0];
  EXPECT_NE(error_of(Json::parse(R"({"num_stages": 2, "pipeline": {"stages": 2}})")).find("both given"),
            std::string::npos);
  EXPECT_NE(error_of(Json::parse(R"({"pipeline": {"stages": "auto"}})")).find("PipelineModule(num_stages=...)"),
            std::string::npos);
  EXPECT_EQ(parse(Json::parse(R"({"bfloat16": {"enabled": true}})")).precision, Precision::kBf16);
}

TEST(DeepSpeedKeys, ZeroTwoAndThreeWithAPipelineAreRefusedAsDeepSpeedRefusesThem) {
  const std::string error = error_of(Json::parse(R"({"zero_optimization": {"stage": 2}, "pipeline": {"stages": 2},
                                                     "data_parallel": 2})"));
  EXPECT_NE(error.find("zero_optimization.stage = 2: ZeRO-2 shards the gradients"), std::string::npos) << error;
  EXPECT_NE(error.find("use stage 1 (or 0)"), std::string::npos);
  EXPECT_EQ(parse(Json::parse(R"({"zero_optimization": {"stage": 3}, "data_parallel": 2})")).zero, ZeroStage::kThree);
}

TEST(DeepSpeedKeys, ADeepSpeedExamplesPipelineConfigurationReadsUnchanged) {
  // DeepSpeedExamples' pipeline-parallel example's ds_config.json: the stages and the model are the script's
  // (--pipeline-parallel-size), given here as the command line gives them.
  const Json ds = Json::parse(R"({
    "train_batch_size": 256, "train_micro_batch_size_per_gpu": 8, "steps_per_print": 10,
    "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8}},
    "fp16": {"enabled": true, "initial_scale_power": 16}, "wall_clock_breakdown": false})");
  RunOverrides given;
  given.set("pipeline.stages", 2);
  given.set("model", "gpt2-124m");
  given.set("data_parallel", 2);
  const RunConfig run = parse_run_config(Config::from_json(ds, "ds_config.json"), given);
  EXPECT_EQ(run.pipeline.ranks, 2);
  EXPECT_EQ(run.precision, Precision::kFp16);
  EXPECT_TRUE(run.not_modelled.empty());
  EXPECT_EQ(resolve(run).batch.accumulation, 16);  // 256 / (8 x 2)
}

TEST(DeepSpeedKeys, AYamlConfigurationReadsAsItsJson) {
  const std::filesystem::path dir = testing::make_temp_dir();
  write_file_atomic(dir / "run.yaml", R"(# a course's configuration, in YAML
model: {n_layer: 4, n_head: 2, n_embd: 64, n_ctx: 32}
train_micro_batch_size_per_gpu: 2
gradient_accumulation_steps: 4
optimizer:
  type: AdamW
  params:
    lr: 3.0e-4
    betas: [0.9, 0.95]
bf16:
  enabled: true
pipeline:
  stages: 2
  schedule: "1f1b"
out_dir: "007"
)");
  const RunConfig yaml = load_run_config(dir / "run.yaml");
  EXPECT_EQ(yaml.pipeline.ranks, 2);
  EXPECT_EQ(yaml.batch_keys.gradient_accumulation_steps, 4);
  EXPECT_DOUBLE_EQ(yaml.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(yaml.optimizer.betas[1], 0.95);
  EXPECT_EQ(yaml.precision, Precision::kBf16);
  EXPECT_EQ(yaml.out_dir, "007");  // quoted: a string, not the number 7
}

TEST(DeepSpeedKeys, YamlHasTheLimitsOfJson) {
  EXPECT_EQ(parse_yaml("a: ~\nb: 'true'\nc: true\nd: 1.5\ne: 12\n", "t.yaml"),
            Json::parse(R"({"a": null, "b": "true", "c": true, "d": 1.5, "e": 12})"));
  // A billion laughs: each anchor doubles what the last stands for.
  std::string laughs = "a0: &a0 [x, x]\n";
  for (int i = 1; i < 40; ++i) laughs += fmt::format("a{}: &a{} [*a{}, *a{}]\n", i, i, i - 1, i - 1);
  try {
    parse_yaml(laughs, "laughs.yaml");
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("more than 1048576 YAML nodes"), std::string::npos) << error.what();
  }
  EXPECT_THROW(parse_yaml(std::string(100, '[') + std::string(100, ']'), "deep.yaml"), Error);
  try {
    parse_yaml("a: [1, 2\nb: 3\n", "bad.yaml");
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("bad.yaml: not valid YAML"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace pipeflow
