#include "pipeflow/config/run_config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <string>
#include <vector>

#include "../support/error_of.h"

namespace pipeflow {
namespace {

using testing::error_of;

RunConfig parse(const std::string& json, const RunOverrides& flags = {}) {
  return parse_run_config(Config::parse(json, "run.json"), flags);
}

// The model a weights file would give, for configurations without one.
const ModelFromFile kTinyWeights{resolve_model("gpt-tiny"), "tiny.safetensors"};

ResolvedRun resolved(const std::string& json, const RunOverrides& flags = {}) {
  const RunConfig run = parse(json, flags);
  return resolve(run, run.model ? std::nullopt : std::optional<ModelFromFile>(kTinyWeights));
}

// Every rule: those of the keys alone (parse) and those of the run (resolve).
std::string parse_error(const std::string& json) {
  return error_of([&] { resolved(json); });
}

const char* const kEveryKey = R"({
  "train_batch_size": 48,
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 8,
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR",
                "params": {"total_num_steps": 500, "warmup_min_ratio": 0.1, "warmup_num_steps": 20,
                           "cos_min_ratio": 0.05, "warmup_type": "linear"}},
  "zero_optimization": {"stage": 1},
  "pipeline": {"stages": 4, "partition_method": "uniform", "activation_checkpoint_interval": 1,
               "schedule": "interleaved-1f1b", "virtual_stages": 2},
  "model": {"n_layer": 8, "n_head": 4, "n_embd": 128, "n_ctx": 64, "vocab_size": 256},
  "data": {"paths": ["a.txt", "b.txt"], "validation_fraction": 0.2},
  "steps": 300,
  "seed": 7,
  "eval_interval": 25,
  "out_dir": "runs/x",
  "checkpoint": {"interval": 100, "dir": "ckpt", "load": "ckpt/step-100", "keep": 2},
  "numerics": {"max_skipped_steps": 5},
  "metrics": {"noise_scale_interval": 10},
  "hardware": "a100-80g",
  "devices": 24,
  "tensor_parallel": 2,
  "data_parallel": 3,
  "sequence_parallel": true,
  "recompute": "full",
  "seq_length": 32,
  "comm_mode": "blocking"
})";

TEST(RunConfig, ReadsEveryKey) {
  const ResolvedRun resolved_run = resolved(kEveryKey);
  const RunConfig& run = resolved_run.config;
  EXPECT_EQ(resolved_run.batch.global, 48);
  EXPECT_EQ(resolved_run.batch.micro, 2);
  EXPECT_EQ(resolved_run.batch.accumulation, 8);
  EXPECT_DOUBLE_EQ(run.gradient_clipping, 1.0);
  EXPECT_EQ(run.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(run.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(run.optimizer.betas[1], 0.95);
  EXPECT_DOUBLE_EQ(run.optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(run.optimizer.weight_decay, 0.1);
  EXPECT_EQ(run.scheduler.type, "WarmupCosineLR");
  EXPECT_EQ(run.scheduler.total_num_steps, 500);
  EXPECT_DOUBLE_EQ(run.scheduler.warmup_min_ratio, 0.1);
  EXPECT_EQ(run.scheduler.warmup_num_steps, 20);
  EXPECT_DOUBLE_EQ(run.scheduler.cos_min_ratio, 0.05);
  EXPECT_EQ(run.scheduler.warmup_type, "linear");
  EXPECT_EQ(run.zero, ZeroStage::kOne);
  EXPECT_EQ(run.pipeline.ranks, 4);
  EXPECT_EQ(to_string(run.pipeline.partition_method), "uniform");
  EXPECT_EQ(run.pipeline.recompute_interval, 1);
  EXPECT_EQ(run.pipeline.schedule, "interleaved-1f1b");
  EXPECT_EQ(run.pipeline.chunks, 2);
  EXPECT_EQ(run.model_source, "inline");
  EXPECT_EQ(run.model->layers, 8);
  EXPECT_EQ(run.model->heads, 4);
  EXPECT_EQ(run.model->hidden, 128);
  EXPECT_EQ(run.model->max_positions, 64);
  EXPECT_EQ(run.model->vocab, 256);
  EXPECT_EQ(run.data.paths, (std::vector<std::string>{"a.txt", "b.txt"}));
  EXPECT_DOUBLE_EQ(run.data.validation_fraction, 0.2);
  EXPECT_EQ(run.steps, 300);
  EXPECT_EQ(run.seed, 7u);
  EXPECT_EQ(run.eval_interval, 25);
  EXPECT_EQ(run.out_dir, "runs/x");
  EXPECT_EQ(run.checkpoint.save_interval, 100);
  EXPECT_EQ(run.checkpoint.dir, "ckpt");
  EXPECT_EQ(run.checkpoint.load, "ckpt/step-100");
  EXPECT_EQ(run.checkpoint.keep, 2);
  EXPECT_EQ(run.numerics.max_skipped_steps, 5);
  EXPECT_EQ(run.metrics.noise_scale_interval, 10);
  EXPECT_EQ(run.hardware.name, "a100-80g");
  EXPECT_EQ(run.devices, 24);
  EXPECT_EQ(run.tensor_parallel, 2);
  EXPECT_EQ(run.data_parallel, 3);
  EXPECT_TRUE(run.sequence_parallel);
  EXPECT_EQ(resolved_run.recompute, Recompute::kFull);
  EXPECT_EQ(resolved_run.seq_length, 32);
  EXPECT_EQ(run.comm_mode, CommMode::kBlocking);
}

// Every training example reads and resolves, and its configuration as
// written beside a run's outputs reads back to the same model (a Llama's
// config.json keys inline, with the defaults written out).
TEST(RunConfig, EveryTrainingExampleReadsAndRoundTrips) {
  int examples = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(PIPEFLOW_SOURCE_DIR) + "/examples")) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("train_") || entry.path().extension() != ".json") continue;
    SCOPED_TRACE(name);
    ++examples;
    const RunConfig run = load_run_config(entry.path());
    const ResolvedRun resolved = resolve(run);
    const RunConfig again = parse_run_config(Config::parse(run_config_to_json(run), "again"));
    ASSERT_TRUE(again.model.has_value());
    EXPECT_EQ(again.model->architecture, resolved.model.architecture);
    EXPECT_EQ(again.model->layers, resolved.model.layers);
    EXPECT_EQ(again.model->kv_heads, resolved.model.kv_heads);
    EXPECT_EQ(again.model->ffn, resolved.model.ffn);
    EXPECT_EQ(again.model->tied_embeddings, resolved.model.tied_embeddings);
    EXPECT_EQ(again.model->llama.rope_theta, resolved.model.llama.rope_theta);
    EXPECT_EQ(again.model->llama.rms_norm_eps, resolved.model.llama.rms_norm_eps);
    EXPECT_EQ(again.model->vision, resolved.model.vision);
  }
  EXPECT_GE(examples, 8);
}

// The small vision-language model inline: a GPT with a vision part in the
// same key names (CLIP's tower of GPT-2 blocks over one RGB image: the
// class token in the tower, dropped before the projector).
TEST(RunConfig, AnInlineModelMayHaveAVisionTower) {
  const RunConfig run = parse(R"({"model": {"n_layer": 2, "n_head": 4, "n_embd": 32, "n_ctx": 34,
      "vision": {"n_layer": 1, "n_head": 2, "n_embd": 16, "image_size": 16, "patch_size": 4}}})");
  ASSERT_TRUE(run.model && run.model->vision);
  const VisionSpec& v = *run.model->vision;
  EXPECT_EQ(v, (VisionSpec{.layers = 1, .hidden = 16, .heads = 2, .ffn = 64, .image_size = 16, .patch_size = 4,
                           .channels = 3, .class_token = true, .drop_class_token = true, .images = 1}));
  EXPECT_EQ(image_tokens(v), 16);
  EXPECT_EQ(vision_tokens(v), 17);
  EXPECT_EQ(parse_error(R"({"model": {"n_layer": 2, "n_head": 4, "n_embd": 32, "n_ctx": 34,
      "vision": {"n_layer": 1, "n_head": 2, "n_embd": 16, "image_size": 16, "patch_size": 5}}})"),
            "run.json: model.vision.image_size = 16: must be a multiple of patch_size (5): the image is cut into whole "
            "patches");
  EXPECT_EQ(parse_error(R"({"model": {"n_layer": 2, "n_head": 4, "n_embd": 32, "n_ctx": 34,
      "vision": {"n_layer": 1, "n_head": 2, "n_embd": 16, "image_size": 16}}})"),
            "run.json: model.vision.patch_size = (absent): is required: pixels per side of a patch");
}

TEST(RunConfig, DefaultsAreDeepSpeedsAndPipeflows) {
  const RunConfig run = default_run_config();
  EXPECT_EQ(run.source, "the command line");
  const ResolvedRun resolved_run = resolve(run, kTinyWeights);
  EXPECT_EQ(resolved_run.batch.global, 1);
  EXPECT_EQ(resolved_run.batch.micro, 1);
  EXPECT_EQ(resolved_run.batch.accumulation, 1);
  EXPECT_EQ(resolved_run.seq_length, 64);  // the model's context
  EXPECT_DOUBLE_EQ(run.gradient_clipping, 0);
  EXPECT_DOUBLE_EQ(run.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(run.optimizer.betas[0], 0.9);
  EXPECT_DOUBLE_EQ(run.optimizer.betas[1], 0.999);
  EXPECT_DOUBLE_EQ(run.optimizer.weight_decay, 0.01);
  EXPECT_TRUE(run.scheduler.type.empty());
  EXPECT_EQ(run.zero, ZeroStage::kNone);
  EXPECT_EQ(run.pipeline.ranks, 1);
  EXPECT_EQ(to_string(run.pipeline.partition_method), "parameters");
  EXPECT_EQ(run.pipeline.schedule, "1f1b");
  EXPECT_TRUE(run.model_source.empty());
  EXPECT_FALSE(run.model.has_value());
  EXPECT_TRUE(run.data.paths.empty());
  EXPECT_DOUBLE_EQ(run.data.validation_fraction, 0.1);
  EXPECT_EQ(run.steps, 100);
  EXPECT_EQ(run.seed, 1234u);
  EXPECT_EQ(run.hardware.name, "cpu");
  EXPECT_FALSE(run.devices.has_value());
  EXPECT_EQ(resolved_run.recompute, Recompute::kNone);
  EXPECT_EQ(run.comm_mode, CommMode::kOverlapped);
}

TEST(RunConfig, SchedulersReadTheirOwnParams) {
  const RunConfig warmup = parse(R"({"scheduler": {"type": "WarmupLR",
      "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3, "warmup_num_steps": 50}}})");
  EXPECT_DOUBLE_EQ(warmup.scheduler.warmup_min_lr, 1e-5);
  EXPECT_DOUBLE_EQ(warmup.scheduler.warmup_max_lr, 1e-3);
  EXPECT_EQ(warmup.scheduler.warmup_num_steps, 50);
  EXPECT_EQ(warmup.scheduler.warmup_type, "log");
  const RunConfig decay = parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 900}}})");
  EXPECT_EQ(decay.scheduler.total_num_steps, 900);
  EXPECT_DOUBLE_EQ(decay.scheduler.warmup_max_lr, 1e-3);
  EXPECT_EQ(parse_error(R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})"),
            "run.json: unknown key 'scheduler.params.cos_min_ratio': remove it or fix its spelling");
  EXPECT_EQ(parse_error(R"({"scheduler": {"type": "WarmupDecayLR"}})"),
            "run.json: scheduler.params.total_num_steps is required but missing");
  EXPECT_EQ(parse_error(R"({"scheduler": {"type": "OneCycle"}})"),
            "run.json: scheduler.type = \"OneCycle\": pipeflow runs DeepSpeed's WarmupLR, WarmupDecayLR and "
            "WarmupCosineLR");
  EXPECT_EQ(parse_error(R"({"scheduler": {"type": "WarmupCosineLR",
      "params": {"total_num_steps": 100, "warmup_num_steps": 100}}})"),
            "run.json: scheduler.params.total_num_steps = 100: must exceed warmup_num_steps (the cosine phase "
            "needs steps)");
}

TEST(RunConfig, DeepSpeedsAdamReadsAsAdamW) {
  EXPECT_EQ(parse(R"({"optimizer": {"type": "Adam"}})").optimizer.type, "Adam");
  EXPECT_TRUE(parse(R"({"optimizer": {"type": "Adam"}})").optimizer.adam_w_mode);
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": "SGD"}})"),
            "run.json: optimizer.type = \"SGD\": pipeflow runs DeepSpeed's Adam and AdamW: set \"type\": \"AdamW\" "
            "(or \"Adam\" with adam_w_mode false for Adam with L2 weight decay)");
  EXPECT_EQ(parse_error(R"({"optimizer": {"params": {"betas": [0.9]}}})"),
            "run.json: optimizer.params.betas = [0.9]: must be [beta1, beta2]");
}

TEST(RunConfigBatch, AnyTwoKeysDetermineTheThird) {
  const auto sizes = [](std::optional<int> total, std::optional<int> micro, std::optional<int> accumulation,
                        int dp) {
    const BatchSizes b = resolve_batch_sizes({total, micro, accumulation}, dp, "run.json");
    return std::vector<int>{b.global, b.micro, b.accumulation};
  };
  EXPECT_EQ(sizes(64, 4, std::nullopt, 2), (std::vector<int>{64, 4, 8}));
  EXPECT_EQ(sizes(64, std::nullopt, 8, 2), (std::vector<int>{64, 4, 8}));
  EXPECT_EQ(sizes(std::nullopt, 4, 8, 2), (std::vector<int>{64, 4, 8}));
  EXPECT_EQ(sizes(64, 4, 8, 2), (std::vector<int>{64, 4, 8}));
  EXPECT_EQ(sizes(64, std::nullopt, std::nullopt, 2), (std::vector<int>{64, 32, 1}));
  EXPECT_EQ(sizes(std::nullopt, 4, std::nullopt, 2), (std::vector<int>{8, 4, 1}));
  EXPECT_EQ(sizes(std::nullopt, std::nullopt, std::nullopt, 2), (std::vector<int>{2, 1, 1}));
}

TEST(RunConfigBatch, BrokenRulesNameBothSidesAndTheFix) {
  EXPECT_EQ(parse_error(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                            "gradient_accumulation_steps": 8})"),
            "run.json: train_batch_size = 64 but train_micro_batch_size_per_gpu × gradient_accumulation_steps × "
            "data_parallel = 4 × 8 × 1 = 32: give two of the three and let the third follow, or make them agree");
  EXPECT_EQ(parse_error(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})"),
            "run.json: train_batch_size = 30 is not a multiple of train_micro_batch_size_per_gpu × data_parallel = "
            "4 × 1 = 4: use train_batch_size 28 or 32");
  EXPECT_EQ(parse_error(R"({"train_batch_size": 30, "gradient_accumulation_steps": 4, "data_parallel": 2})"),
            "run.json: train_batch_size = 30 is not a multiple of gradient_accumulation_steps × data_parallel = "
            "4 × 2 = 8: use train_batch_size 24 or 32");
  EXPECT_EQ(parse_error(R"({"train_batch_size": 5, "data_parallel": 2})"),
            "run.json: train_batch_size = 5 is not a multiple of data_parallel = 2: use train_batch_size 4 or 6");
  EXPECT_EQ(parse_error(R"({"train_micro_batch_size_per_gpu": 0})"),
            "run.json: train_micro_batch_size_per_gpu = 0: must be a positive integer: sequences per micro-batch");
}

// Products beyond an int are errors, not wrapped values: 65536 × 65536 wrapped
// to 0, and `pipeflow simulate --micro-batch 65536 --global-batch 65536 --dp
// 65536` died of SIGFPE dividing by it.
TEST(RunConfigBatch, ProductsTooLargeForAnIntAreNamed) {
  EXPECT_EQ(parse_error(R"({"train_batch_size": 65536, "train_micro_batch_size_per_gpu": 65536,
                            "gradient_accumulation_steps": 65536})"),
            "run.json: train_micro_batch_size_per_gpu × gradient_accumulation_steps × data_parallel = 65536 × 65536 "
            "× 1: more than 2147483647 sequences per step: use smaller sizes");
  EXPECT_EQ(parse_error(R"({"train_batch_size": 65536, "train_micro_batch_size_per_gpu": 65536,
                            "data_parallel": 65536})"),
            "run.json: train_micro_batch_size_per_gpu × data_parallel = 65536 × 65536: more than 2147483647 "
            "sequences: use smaller sizes");
  EXPECT_EQ(parse_error(R"({"gradient_accumulation_steps": 65536, "data_parallel": 65536})"),
            "run.json: train_micro_batch_size_per_gpu × gradient_accumulation_steps × data_parallel = 1 × 65536 × "
            "65536: more than 2147483647 sequences per step: use smaller sizes");
  EXPECT_EQ(parse_error(R"({"tensor_parallel": 96, "pipeline": {"stages": 98, "schedule": "gpipe"},
                            "data_parallel": 1000000})"),
            "run.json: tensor_parallel × pipeline.stages × data_parallel = 96 × 98 × 1000000: more than 2147483647 "
            "devices: use smaller sizes");
}

TEST(RunConfig, UnknownKeysAreErrorsNamingThePath) {
  // tensorboard is DeepSpeed's (read, not modelled: deepspeed_keys.h); my_tool is nobody's.
  EXPECT_EQ(parse_error(R"({"pipeline": {"stagse": 2}, "tensorboard": {"enabled": true}, "my_tool": {}})"),
            "run.json: unknown keys 'my_tool', 'pipeline.stagse' (did you mean 'pipeline.stages'?): remove it or fix "
            "its spelling");
  EXPECT_EQ(parse_error(R"({"model": {"n_layer": 2, "n_head": 2, "n_embd": 8, "n_ctx": 8, "n_lyer": 2}})"),
            "run.json: unknown key 'model.n_lyer' (did you mean 'model.n_layer'?): remove it or fix its spelling");
  EXPECT_EQ(parse_error(R"({"optimizer": {"params": {"lrr": 1}}})"),
            "run.json: unknown key 'optimizer.params.lrr' (did you mean 'optimizer.params.lr'?): remove it or fix "
            "its spelling");
}

TEST(RunConfig, BadValuesNameThePathTheValueTheRuleAndTheFix) {
  EXPECT_EQ(parse_error(R"({"pipeline": {"stages": 0}})"),
            "run.json: pipeline.stages = 0: must be a positive integer: the number of pipeline ranks");
  EXPECT_EQ(parse_error(R"({"pipeline": {"schedule": "2f2b"}})"),
            "run.json: pipeline.schedule = \"2f2b\": known schedules are gpipe, 1f1b, interleaved-1f1b, looped-bfs, "
            "zb-h1, zb-h2, zbv, dualpipev, inference");
  EXPECT_EQ(parse_error(R"({"pipeline": {"schedule": "inference"}})"),
            "run.json: pipeline.schedule = \"inference\": inference is a forward-only inference schedule, with no "
            "backward to train with: use a training schedule (gpipe, 1f1b, ...), or pipeflow generate for inference");
  EXPECT_EQ(parse_error(R"({"pipeline": {"partition_method": "bogus"}})"),
            "run.json: pipeline.partition_method = \"bogus\": unknown partition method \"bogus\": use uniform, "
            "parameters, type:REGEX, balanced, counts:N,N,... or bounds:0,B,...,LAYERS");
  EXPECT_EQ(parse_error(R"({"pipeline": {"stages": 4}, "gradient_accumulation_steps": 2})"),
            "run.json: pipeline.schedule = \"1f1b\" (stages = 4, micro-batches per step = 2, virtual_stages = 1): "
            "1f1b needs microbatches >= stages (got 2 < 4): raise gradient_accumulation_steps or use gpipe");
  EXPECT_EQ(parse_error(R"({"recompute": "some"})"),
            "run.json: recompute = \"some\": recompute \"some\": use none, selective or full");
  EXPECT_EQ(parse_error(R"({"recompute": "selective", "pipeline": {"activation_checkpoint_interval": 1}})"),
            "run.json: recompute = \"selective\": pipeline.activation_checkpoint_interval = 1 recomputes whole "
            "blocks: drop recompute or set it to \"full\"");
  EXPECT_EQ(parse_error(R"({"comm_mode": "eager"})"),
            "run.json: comm_mode = \"eager\": must be \"overlapped\" or \"blocking\"");
  EXPECT_EQ(parse_error(R"({"block_launch_overhead_s": -0.004})"),
            "run.json: block_launch_overhead_s = -0.004: must be a number of seconds from 0 to 1: the host time each "
            "block pass adds beyond its kernels (4 ms is 0.004); 0 or absent leaves it out");
  EXPECT_NE(parse_error(R"({"block_launch_overhead_s": 4})").find("block_launch_overhead_s = 4: must be a number of "
                                                                  "seconds from 0 to 1"),
            std::string::npos);
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stage": 4}})"),
            "run.json: zero_optimization.stage = 4: must be 0, 1, 2 or 3");
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stage": 1, "reduce_bucket_size": 0}})"),
            "run.json: zero_optimization.reduce_bucket_size = 0: must lie in [1, 2147483647]: the elements reduced "
            "over the data-parallel replicas per call (MPI counts are int)");
  EXPECT_EQ(parse_error(R"({"data": {"validation_fraction": 1}})"),
            "run.json: data.validation_fraction = 1: must lie in [0, 1): the share of the text held out");
  EXPECT_EQ(parse_error(R"({"data": {"path": "a", "paths": ["b"]}})"),
            "run.json: data.paths = [\"b\"]: give either path or paths, not both");
  EXPECT_EQ(parse_error(R"({"gradient_clipping": -1})"),
            "run.json: gradient_clipping = -1: must be >= 0: the largest global gradient norm, 0 for none");
  EXPECT_EQ(parse_error(R"({"devices": 8, "tensor_parallel": 2})"),
            "run.json: devices = 8: tensor_parallel × pipeline stages × data_parallel = 2 × 1 × 1 = 2 devices, "
            "not 8: use data_parallel 4 or devices 2");
  EXPECT_EQ(parse_error(R"({"hardware": "tpu"})"),
            "run.json: hardware = \"tpu\": unknown hardware \"tpu\": use one of a100-40g, a100-80g, h100, h200, "
            "ascend-910b, cpu or the path of a hardware JSON file");
  EXPECT_EQ(parse_error(R"({"model": "gpt-tiny", "seq_length": 100})"),
            "run.json: seq_length = 100: gpt-tiny has 64 positions: use seq_length <= 64");
  EXPECT_EQ(parse_error(R"({"model": {"n_layer": 2, "n_head": 3, "n_embd": 64, "n_ctx": 16}})"),
            "run.json: model.n_embd = 64: must be a multiple of n_head (3): pipeflow's GPT splits the width into "
            "equal heads");
  EXPECT_EQ(parse_error(R"({"model": {"n_layer": 2, "n_head": 2, "n_embd": 64}})"),
            "run.json: model.n_ctx = (absent): is required: the most positions a sequence may have");
  EXPECT_EQ(parse_error(R"({"steps": "many"})"), "run.json: steps must be an integer, got \"many\"");
  EXPECT_EQ(parse_error(R"({"checkpoint": {"keep": -1}})"),
            "run.json: checkpoint.keep = -1: must be an integer >= 0: the newest checkpoints kept, 0 for all");
  EXPECT_EQ(parse_error(R"({"numerics": {"max_skipped_steps": 0}})"),
            "run.json: numerics.max_skipped_steps = 0: must be a positive integer: non-finite steps in a row before "
            "stopping");
  EXPECT_EQ(parse_error(R"({"metrics": {"noise_scale_interval": -1}})"),
            "run.json: metrics.noise_scale_interval = -1: must be an integer >= 0: steps between measurements of the "
            "gradient noise scale, 0 for none");
}

TEST(RunConfig, ModelIsAPresetAConfigJsonOrTheSmallGpt) {
  EXPECT_EQ(parse(R"({"model": "gpt2-124m"})").model->hidden, 768);
  const RunConfig hf =
      parse(std::string(R"({"model": ")") + PIPEFLOW_SOURCE_DIR + R"(/tests/data/hf/llama-3-8b/config.json"})");
  EXPECT_EQ(hf.model->architecture, Architecture::kLlama);
  EXPECT_EQ(hf.model->kv_heads, 8);
  EXPECT_EQ(parse_error(R"({"model": "gpt9"})"),
            "run.json: model = \"gpt9\": unknown model \"gpt9\": use one of gpt2-124m, gpt2-355m, gpt2-774m, gpt2-1.5b, "
            "gpt3-1.3b, gpt3-6.7b, gpt3-13b, gpt3-175b, llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b, "
            "llama3-405b, gpt-tiny or the path of a Hugging Face config.json");
}

TEST(RunConfig, WritesWhatItReadsBack) {
  const RunConfig run = parse(kEveryKey);
  const std::string json = run_config_to_json(run);
  const RunConfig again = parse_run_config(Config::parse(json, "again.json"));
  EXPECT_EQ(run_config_to_json(again), json);
  EXPECT_EQ(resolve(again).batch.accumulation, 8);
  EXPECT_EQ(again.model->layers, 8);
}

// PyTorch 2.6's ZB-H1 on 2 ranks with 4 micro-batches (examples/schedules/).
const std::string kZbFile = std::string(PIPEFLOW_SOURCE_DIR) + "/examples/schedules/pytorch26_zbh1_2x4.csv";

TEST(RunConfigScheduleFile, TheFileFixesRanksChunksAndMicrobatches) {
  const ResolvedRun run = resolved(R"({"model": "gpt2-124m", "pipeline": {"schedule_file": ")" + kZbFile + R"("}})");
  EXPECT_EQ(run.config.pipeline.ranks, 2);
  EXPECT_EQ(run.config.pipeline.chunks, 1);
  EXPECT_EQ(run.batch.accumulation, 4);
  EXPECT_EQ(run.config.pipeline.schedule, "");
  ASSERT_TRUE(run.config.pipeline.file_schedule);
  EXPECT_EQ(run.config.pipeline.file_schedule->name(), "pytorch26_zbh1_2x4.csv");
  EXPECT_EQ(run.config.pipeline.file_note,
            "pytorch26_zbh1_2x4.csv: read as PyTorch 2.5-2.6's CSV (BW full backward, B/W split)");
  // Kept beside a run, it reads back the same.
  const std::string json = run_config_to_json(run.config);
  EXPECT_NE(json.find("\"schedule_file\": \"" + kZbFile + "\""), std::string::npos) << json;
  EXPECT_EQ(json.find("\"schedule\":"), std::string::npos) << json;
  EXPECT_EQ(run_config_to_json(parse_run_config(Config::parse(json, "again.json"))), json);
}

TEST(RunConfigScheduleFile, KeysThatDisagreeWithTheFileAreErrorsNamingBoth) {
  const std::string file = R"("schedule_file": ")" + kZbFile + R"(")";
  EXPECT_EQ(parse_error(R"({"pipeline": {"schedule": "1f1b", )" + file + "}}"),
            "run.json: pipeline.schedule = \"1f1b\": and schedule_file = \"" + kZbFile +
                "\" both choose the schedule: give one of the two");
  EXPECT_EQ(parse_error(R"({"pipeline": {"virtual_stages": 2, )" + file + "}}"),
            "run.json: pipeline.virtual_stages = 2: but schedule_file " + kZbFile +
                " has 1 model chunk per rank: remove virtual_stages to take the file's, or use a file dumped for 2");
  EXPECT_EQ(parse_error(R"({"gradient_accumulation_steps": 8, "pipeline": {)" + file + "}}"),
            "run.json: gradient_accumulation_steps = 8 (given or derived from the batch keys) but "
            "pipeline.schedule_file " + kZbFile + " runs 4 micro-batches per step: leave gradient_accumulation_steps "
            "out and give at most one of train_batch_size and train_micro_batch_size_per_gpu to take the file's, or "
            "use a file dumped for 8");
  // The flag alone, without a configuration file, is the key.
  RunOverrides flag;
  flag.set("pipeline.schedule_file", kZbFile);
  EXPECT_EQ(default_run_config(flag).pipeline.ranks, 2);
  // A flag that picks the schedule replaces the file's choice.
  RunOverrides generator;
  generator.set("pipeline.schedule", "gpipe");
  EXPECT_EQ(resolved(R"({"pipeline": {"stages": 2, )" + file + "}}", generator).config.pipeline.schedule, "gpipe");
}

TEST(RunConfig, CommandLineOverridesTheFileAndIsCheckedTheSameWay) {
  const std::string file = R"({"model": "gpt2-124m", "train_batch_size": 32, "train_micro_batch_size_per_gpu": 2,
                                "gradient_accumulation_steps": 16, "pipeline": {"stages": 2}})";
  RunOverrides flags;
  flags.set("pipeline.stages", 4);
  flags.set("train_batch_size", 64);
  flags.set("pipeline.schedule", "zb-h1");
  const ResolvedRun run = resolved(file, flags);
  EXPECT_EQ(run.config.pipeline.ranks, 4);
  EXPECT_EQ(run.config.pipeline.schedule, "zb-h1");
  EXPECT_EQ(run.batch.global, 64);
  EXPECT_EQ(run.batch.micro, 2);
  EXPECT_EQ(run.batch.accumulation, 32);
  EXPECT_EQ(run.config.source, "run.json with the command line");
  EXPECT_EQ(parse(file).source, "run.json");

  RunOverrides bad = flags;
  bad.set("pipeline.stages", 0);
  EXPECT_EQ(error_of([&] { parse(file, bad); }),
            "run.json with the command line: pipeline.stages = 0: must be a positive integer: the number of "
            "pipeline ranks");

  RunOverrides dp = flags;
  dp.set("data_parallel", 2);
  EXPECT_EQ(resolved(file, dp).batch.accumulation, 16);  // keys B = 64, b = 2: m follows
}

TEST(RunConfig, DeepSpeedKeysAreReadAsDeepSpeedReadsThem) {
  const RunConfig run = parse(R"({"optimizer": {"type": "adam", "params": {"adam_w_mode": false, "torch_adam": true}},
                                  "zero_optimization": {"stage": 0}, "fp16": {"enabled": false, "loss_scale": 0},
                                  "bf16": {"enabled": false}, "steps_per_print": 5, "wall_clock_breakdown": true})");
  EXPECT_FALSE(run.optimizer.adam_w_mode);  // Adam with L2
  EXPECT_EQ(run.steps_per_print, 5);
  EXPECT_EQ(run.zero, ZeroStage::kNone);
  EXPECT_TRUE(parse(R"({"optimizer": {"type": "Adam"}})").optimizer.adam_w_mode);
  // Type AdamW is AdamW whatever adam_w_mode says (DeepSpeed's effective_adam_w_mode).
  EXPECT_TRUE(parse(R"({"optimizer": {"type": "ADAMW", "params": {"adam_w_mode": false}}})").optimizer.adam_w_mode);
  // Precision: DeepSpeed's fp16 and bf16 sections, neither enabled is fp32.
  EXPECT_EQ(parse("{}").precision, Precision::kFp32);
  EXPECT_EQ(parse(R"({"bf16": {"enabled": true}})").precision, Precision::kBf16);
  const RunConfig half = parse(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
                                            "loss_scale_window": 200, "hysteresis": 1, "min_loss_scale": 0.25},
                                   "communication_data_type": "fp32"})");
  EXPECT_EQ(half.precision, Precision::kFp16);
  EXPECT_EQ(half.loss_scale.initial_scale_power, 12);
  EXPECT_EQ(half.loss_scale.loss_scale_window, 200);
  EXPECT_EQ(half.loss_scale.hysteresis, 1);
  EXPECT_EQ(half.loss_scale.min_loss_scale, 0.25);
  EXPECT_EQ(half.communication_data_type, Precision::kFp32);
  EXPECT_EQ(parse_error(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})"),
            "run.json: bf16.enabled = true: and fp16.enabled are both true: enable one of the two (bf16 needs no loss "
            "scaling)");
  EXPECT_EQ(parse_error(R"({"fp16": {"hysteresis": 0}})"),
            "run.json: fp16.hysteresis = 0: must be a positive integer: overflowing steps in a row before the scale "
            "halves");
  EXPECT_EQ(parse_error(R"({"communication_data_type": "fp8"})"),
            "run.json: communication_data_type = \"fp8\": precision \"fp8\": use fp32, bf16 or fp16");
  // What gradients accumulate in: data_types.grad_accum_dtype, else fp32 for
  // bf16 without ZeRO (DeepSpeed's bf16 optimizer), else the precision.
  EXPECT_EQ(parse(R"({"data_types": {"grad_accum_dtype": "bf16"}})").grad_accum_dtype, Precision::kBf16);
  EXPECT_EQ(parse("{}").grad_accum_dtype, std::nullopt);
  EXPECT_EQ(parse_error(R"({"data_types": {"grad_accum_dtype": "fp8"}})"),
            "run.json: data_types.grad_accum_dtype = \"fp8\": precision \"fp8\": use fp32, bf16 or fp16");
  EXPECT_EQ(resolved(R"({"bf16": {"enabled": true}})").gradient_accumulation, Precision::kFp32);
  EXPECT_EQ(resolved(R"({"fp16": {"enabled": true}})").gradient_accumulation, Precision::kFp16);
  EXPECT_EQ(resolved(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}})")
                .gradient_accumulation,
            Precision::kBf16);
  EXPECT_EQ(parse(run_config_to_json(parse(R"({"data_types": {"grad_accum_dtype": "fp16"}})"))).grad_accum_dtype,
            Precision::kFp16);
  // --bf16 over a file in fp16 turns the file's fp16 off.
  RunOverrides bf16;
  bf16.set("bf16.enabled", true);
  EXPECT_EQ(parse(R"({"fp16": {"enabled": true}})", bf16).precision, Precision::kBf16);
  EXPECT_EQ(parse_error(R"({"steps_per_print": -1})"),
            "run.json: steps_per_print = -1: must be an integer >= 0: steps between progress lines, 0 for about 50");
}

TEST(RunConfig, AModelFromAFileMustAgreeWithTheConfigurations) {
  const ResolvedRun from_file = resolved(R"({"pipeline": {"stages": 2}, "gradient_accumulation_steps": 2})");
  EXPECT_EQ(from_file.model.name, "gpt-tiny");
  EXPECT_EQ(from_file.seq_length, 64);
  // The copy kept beside the outputs names the shape that ran.
  EXPECT_EQ(parse(run_config_to_json(from_file.config)).model->layers, from_file.model.layers);
  const RunConfig other = parse(R"({"model": {"n_layer": 3, "n_head": 2, "n_embd": 32, "n_ctx": 32}})");
  EXPECT_EQ(error_of([&] { resolve(other, kTinyWeights); }),
            "run.json: model = {...} (3 layers, 2 heads, width 32, context 32, vocabulary 256) but tiny.safetensors "
            "holds 4 layers, 4 heads, width 128, context 64, vocabulary 256: leave model out to take the file's "
            "shape, or use a file of this model");
  EXPECT_EQ(error_of([] { resolve(default_run_config()); }),
            "the command line: no model: set \"model\" (a preset such as gpt2-124m, a config.json path, or "
            "{n_layer, n_head, n_embd, n_ctx}), pass --model, or start from a weights file or checkpoint (--weights, "
            "--resume)");
}

// Megatron-LM's rules for sequence parallelism: at tensor_parallel 1 it is
// turned off with a warning (the key kept as written, so that a later
// tensor_parallel override finds it); with t > 1 the sequence must split
// evenly over the t ranks.
TEST(RunConfig, SequenceParallelIsOffAtTensorParallelOneAndNeedsTheSequenceDivisible) {
  const std::string file = R"({"model": "gpt2-124m", "sequence_parallel": true})";
  const ResolvedRun one = resolved(file);
  EXPECT_TRUE(one.config.sequence_parallel);
  EXPECT_FALSE(one.sequence_parallel);
  ASSERT_EQ(one.config.warnings.size(), 1u);
  EXPECT_EQ(one.config.warnings[0],
            "run.json: sequence_parallel = true with tensor_parallel = 1: sequence parallelism splits activations "
            "over the tensor-parallel ranks, so it is off (as Megatron-LM turns it off); use tensor_parallel > 1 for "
            "it");
  RunOverrides tp;
  tp.set("tensor_parallel", 4);
  const ResolvedRun four = resolved(file, tp);
  EXPECT_TRUE(four.config.warnings.empty());
  EXPECT_TRUE(four.sequence_parallel);
  EXPECT_TRUE(parse(R"({"model": "gpt2-124m"})").warnings.empty());

  EXPECT_EQ(parse_error(R"({"model": "gpt2-124m", "tensor_parallel": 8, "sequence_parallel": true,
                            "seq_length": 1001})"),
            "run.json: sequence_parallel = true: seq_length 1001 is not a multiple of tensor_parallel 8: Megatron's "
            "sequence parallelism splits the sequence over the tensor-parallel ranks: use seq_length 1000 or 1008, "
            "another tensor_parallel, or drop sequence_parallel");
  // The default sequence is the model's context: gpt-tiny's 64 over 3 ranks.
  EXPECT_EQ(parse_error(R"({"model": "gpt-tiny", "tensor_parallel": 3, "sequence_parallel": true})"),
            "run.json: sequence_parallel = true: seq_length 64 is not a multiple of tensor_parallel 3: Megatron's "
            "sequence parallelism splits the sequence over the tensor-parallel ranks: use seq_length 63 or 66, "
            "another tensor_parallel, or drop sequence_parallel (seq_length is absent: the model's context)");
  // Without sequence parallelism, or at t = 1, any length is fine.
  EXPECT_EQ(resolved(R"({"model": "gpt2-124m", "tensor_parallel": 8, "seq_length": 1001})").seq_length, 1001);
  EXPECT_EQ(resolved(R"({"model": "gpt2-124m", "sequence_parallel": true, "seq_length": 1001})").seq_length, 1001);
}


// Uniform over [1, 4]: each length a quarter of 40,000 draws (standard error 0.0022); normal (100, 10):
// the sample's mean and deviation within 0.2 of them (standard errors 0.05 and 0.035). A seed gives the
// same lengths; another seed others.
TEST(RunConfigLengths, DistributionsDrawWhatTheySay) {
  const LengthDistribution uniform{.kind = LengthDistribution::Kind::kUniform, .min = 1, .max = 4, .seed = 7};
  const std::vector<int> drawn = uniform.draw(40000);
  for (int length = 1; length <= 4; ++length) {
    EXPECT_NEAR(static_cast<double>(std::count(drawn.begin(), drawn.end(), length)) / 40000, 0.25, 0.01) << length;
  }
  EXPECT_EQ(uniform.draw(40000), drawn);
  LengthDistribution reseeded = uniform;
  reseeded.seed = 8;
  EXPECT_NE(reseeded.draw(40000), drawn);
  const LengthDistribution normal{
      .kind = LengthDistribution::Kind::kNormal, .min = 1, .max = 1000, .mean = 100, .std = 10, .seed = 0};
  double sum = 0, squares = 0;
  for (int length : normal.draw(40000)) {
    sum += length;
    squares += static_cast<double>(length) * length;
  }
  const double mean = sum / 40000;
  EXPECT_NEAR(mean, 100, 0.2);
  EXPECT_NEAR(std::sqrt(squares / 40000 - mean * mean), 10, 0.2);
  LengthDistribution narrow = normal;
  narrow.std = 0;
  EXPECT_EQ(narrow.draw(3), (std::vector<int>{100, 100, 100}));
  LengthDistribution clipped = normal;
  clipped.max = 100;
  for (int length : clipped.draw(1000)) EXPECT_LE(length, 100);
}

// resolve() draws a step's m lengths; the distribution round-trips through the written configuration.
TEST(RunConfigLengths, ResolveDrawsAStepsLengthsAndChecksTheLongest) {
  const std::string keys = R"({"model": "gpt-tiny", "train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
      "seq_length": 32, "variable_seq_lengths": {"distribution": "uniform", "min": 8, "max": 32, "seed": 3}})";
  const ResolvedRun run = resolved(keys);
  EXPECT_EQ(run.microbatch_lengths, (LengthDistribution{.min = 8, .max = 32, .seed = 3}.draw(8)));
  EXPECT_EQ(parse(run_config_to_json(run.config)).seq_length_distribution, run.config.seq_length_distribution);
  EXPECT_EQ(resolved(R"({"model": "gpt-tiny", "seq_length": 32, "variable_seq_lengths": [8, 16]})").microbatch_lengths,
            (std::vector<int>{8, 16}));
  EXPECT_EQ(parse_error(R"({"model": "gpt-tiny", "seq_length": 16,
      "variable_seq_lengths": {"distribution": "uniform", "min": 8, "max": 32}})"),
            "run.json: variable_seq_lengths has max 32 > seq_length 16: seq_length is the longest micro-batch's (what "
            "the buffers are sized for): raise seq_length to 32 or shorten the lengths");
  EXPECT_EQ(parse_error(R"({"variable_seq_lengths": {"distribution": "zipf", "min": 8, "max": 32}})"),
            "run.json: variable_seq_lengths.distribution = \"zipf\": must be \"uniform\" (min, max) or \"normal\" "
            "(mean, std, min, max)");
  EXPECT_EQ(parse_error(R"({"variable_seq_lengths": {"distribution": "uniform", "min": 8, "max": 32, "mean": 20}})"),
            "run.json: variable_seq_lengths.mean = 20: belongs to the distribution \"normal\" (mean, std, min, max); "
            "\"uniform\" takes min and max alone: remove it, or set distribution to \"normal\" with its mean and std");
  EXPECT_EQ(parse_error(R"({"variable_seq_lengths": {"distribution": "normal", "min": 8, "max": 32, "mean": 40,
      "std": 4}})"),
            "run.json: variable_seq_lengths.mean = 40: must be in [min, max] = [8, 32]");
  EXPECT_EQ(parse_error(R"({"model": "gpt-tiny", "seq_length": 32, "variable_seq_lengths": [8, 0]})"),
            "run.json: variable_seq_lengths holds 0: every length must be >= 1 (tokens per sequence of a micro-batch)");
  EXPECT_EQ(parse_error(R"({"variable_images": [1, 0]})"),
            "run.json: variable_images = [1,0]: every count must be >= 1 (images per sequence; a micro-batch without "
            "images is not modelled)");
}

}  // namespace
}  // namespace pipeflow

namespace pipeflow {
namespace {

// resolve() fixes every default once: the schedule that runs, the
// checkpoint folder, the progress lines, and under mpirun the replicas.
TEST(RunConfigResolve, BuildsTheScheduleAndFixesEveryDefault) {
  const ResolvedRun run = resolved(R"({"pipeline": {"stages": 2, "schedule": "interleaved-1f1b", "virtual_stages": 2},
                                       "gradient_accumulation_steps": 4, "steps": 200, "out_dir": "runs/y"})");
  EXPECT_EQ(run.schedule.name(), "interleaved-1f1b");
  EXPECT_EQ(run.schedule.num_ranks(), 2);
  EXPECT_EQ(run.schedule.chunks_per_rank(), 2);
  EXPECT_EQ(run.schedule.num_microbatches(), 4);
  EXPECT_EQ(run.checkpoint_dir, "runs/y/checkpoints");
  EXPECT_EQ(run.steps_per_print, 4);  // about 50 lines over 200 steps
  const ResolvedRun given = resolved(R"({"checkpoint": {"dir": "ckpt"}, "steps_per_print": 7, "steps": 200})");
  EXPECT_EQ(given.checkpoint_dir, "ckpt");
  EXPECT_EQ(given.steps_per_print, 7);
  EXPECT_EQ(resolved(R"({"steps": 3})").steps_per_print, 1);
}

TEST(RunConfigResolve, TheWorldGivesTheReplicasTheFileLeavesOut) {
  const RunConfig run = parse(R"({"pipeline": {"stages": 2}, "train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
                                  "gradient_accumulation_steps": 8})");
  const ResolvedRun four = resolve(run, kTinyWeights, 4);
  EXPECT_EQ(four.config.data_parallel, 2);
  EXPECT_EQ(four.batch.global, 8);  // the accumulation is derived again, as --data-parallel does
  EXPECT_EQ(four.batch.accumulation, 4);
  EXPECT_EQ(four.devices, 4);
  EXPECT_EQ(error_of([&] { resolve(run, kTinyWeights, 3); }),
            "run.json: 3 processes were started, not a multiple of tensor_parallel × pipeline.stages = 2: start 2 "
            "(mpirun -np 2), or a multiple of it for data parallelism");
  const RunConfig fixed = parse(R"({"pipeline": {"stages": 2}, "data_parallel": 1, "gradient_accumulation_steps": 2})");
  EXPECT_EQ(resolve(fixed, kTinyWeights, 2).config.data_parallel, 1);
  EXPECT_EQ(error_of([&] { resolve(fixed, kTinyWeights, 4); }),
            "run.json: tensor_parallel × pipeline.stages × data_parallel = 1 × 2 × 1 = 2 ranks, but 4 processes were "
            "started: start 2 (mpirun -np 2), or leave data_parallel out to take the processes per pipeline");
}


}  // namespace
}  // namespace pipeflow
