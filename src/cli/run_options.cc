#include "run_options.h"

#include <fmt/format.h>

#include <cstdio>
#include <optional>

#include "pipeflow/core/log.h"

namespace pipeflow::cli {

void RunFlags::add_to(CLI::App* app) {
  app_ = app;
  app->add_option("--model", model_, "Model preset or Hugging Face config.json path (key: model)");
  app->add_option("--hardware", hardware_, "Hardware preset or profile JSON path (key: hardware; default cpu)");
  app->add_option("--devices", devices_, "Devices in all: tp × pp × dp (key: devices)");
  app->add_option("--tensor-parallel,--tp", tensor_parallel_, "Tensor-parallel size (key: tensor_parallel)");
  app->add_option("--stages,--pp", stages_, "Pipeline ranks (key: pipeline.stages)");
  app->add_option("--data-parallel,--dp", data_parallel_, "Data-parallel replicas (key: data_parallel)");
  app->add_option("--micro-batch", micro_batch_, "Sequences per micro-batch (key: train_micro_batch_size_per_gpu)");
  app->add_option("--global-batch", global_batch_,
                  "Sequences per step over all replicas (key: train_batch_size; without a micro-batch, DeepSpeed's "
                  "rule gives one micro-batch of global / dp)");
  app->add_option("--seq-length,--seq", seq_length_, "Tokens per sequence (key: seq_length; default the model's context)");
  app->add_option("--schedule", schedule_, "Schedule name, see pipeflow schedule --list (key: pipeline.schedule)");
  app->add_option("--schedule-file", schedule_file_,
                  "Run this schedule file instead: PyTorch pipelining CSV (2.5+ dialects) or pipeflow JSON; it fixes "
                  "stages, virtual stages and micro-batches (key: pipeline.schedule_file)");
  app->add_option("--virtual", virtual_stages_, "Model chunks per rank (key: pipeline.virtual_stages)");
  app->add_option("--recompute", recompute_, "none, selective or full (key: recompute)")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  app->add_option("--partition", partition_,
                  "uniform, parameters, type:REGEX, balanced, counts:N,.. or bounds:B,.. (key: pipeline.partition_method)");
  app->add_flag("--sequence-parallel", sequence_parallel_, "Megatron sequence parallelism (key: sequence_parallel)");
  app->add_option("--zero", zero_, "ZeRO stage 0..3 (key: zero_optimization.stage)");
  app->add_option("--comm", comm_, "P2P communication: overlapped or blocking (key: comm_mode)")
      ->check(CLI::IsMember({"overlapped", "blocking"}));
}

RunOverrides RunFlags::overrides() const {
  const auto given = [&](const char* flag, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    return app_->count(flag) > 0 ? std::optional<T>(value) : std::nullopt;
  };
  RunOverrides o;
  o.model = given("--model", model_);
  o.hardware = given("--hardware", hardware_);
  o.devices = given("--devices", devices_);
  o.tensor_parallel = given("--tensor-parallel", tensor_parallel_);
  o.stages = given("--stages", stages_);
  o.data_parallel = given("--data-parallel", data_parallel_);
  o.micro_batch = given("--micro-batch", micro_batch_);
  o.global_batch = given("--global-batch", global_batch_);
  o.seq_length = given("--seq-length", seq_length_);
  o.schedule = given("--schedule", schedule_);
  o.schedule_file = given("--schedule-file", schedule_file_);
  o.virtual_stages = given("--virtual", virtual_stages_);
  o.recompute = given("--recompute", recompute_);
  o.sequence_parallel = given("--sequence-parallel", sequence_parallel_);
  o.partition = given("--partition", partition_);
  o.zero_stage = given("--zero", zero_);
  o.comm_mode = given("--comm", comm_);
  return o;
}

void print_config_notes(const RunConfig& config) {
  for (const std::string& warning : config.warnings) log_warning("{}", warning);
  if (!config.pipeline.file_note.empty()) fmt::print(stderr, "{}\n", config.pipeline.file_note);
}

RunConfig run_config_of(const std::string& config_path, const RunOverrides& overrides) {
  return config_path.empty() ? default_run_config(overrides) : load_run_config(config_path, overrides);
}

}  // namespace pipeflow::cli
