#include "pipeflow/runtime/run_settings.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "pipeflow/runtime/stage_partition.h"
#include "pipeflow/runtime/stage_traits.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/model/training.h"
#include "pipeflow/nn/shape_captions.h"

namespace pipeflow::runtime {

ModelFromFile model_of_file(const std::filesystem::path& path) {
  const nn::SafetensorsFile file = read_checkpoint_metadata(path);
  if (holds_vision_language_model(file)) {
    fail("{}: a vision-language model's checkpoint (__metadata__ model_type = \"{}\") resumes only the run of its "
         "model: give the configuration with that model (its vision part) to resume it, or a language model's "
         "checkpoint or weights to this run",
         path.string(), StageTraits<nn::VlmStage>::kModelType);
  }
  return {model_spec(nn::read_config(file)), path.string()};
}

nn::AdamWOptions adamw_options(const OptimizerConfig& o) {
  return {.decoupled_decay = o.adam_w_mode, .lr = o.lr, .betas = o.betas, .eps = o.eps, .weight_decay = o.weight_decay};
}

nn::LrSchedule lr_schedule(const SchedulerConfig& s, double optimizer_lr) {
  const nn::LrSchedule::WarmupSteps warmup{
      .steps = s.warmup_num_steps,
      .shape = s.warmup_type == "linear" ? nn::LrSchedule::Warmup::kLinear : nn::LrSchedule::Warmup::kLog};
  if (s.type == "WarmupLR") return nn::LrSchedule::warmup(s.warmup_min_lr, s.warmup_max_lr, warmup);
  if (s.type == "WarmupDecayLR") {
    return nn::LrSchedule::warmup_decay(s.warmup_min_lr, s.warmup_max_lr, warmup, s.total_num_steps);
  }
  if (s.type == "WarmupCosineLR") {
    return nn::LrSchedule::warmup_cosine(optimizer_lr, s.warmup_min_ratio, s.cos_min_ratio, warmup, s.total_num_steps);
  }
  return nn::LrSchedule::constant(optimizer_lr);
}

namespace {

// freeze and lora as the vision-language model trains them
// (nn::VlmStageOptions): the whole vision encoder frozen or none of it, the
// projector trained, and under LoRA every language-model block's c_attn
// adapted with the rest of the language model frozen. The layers
// apply_training freezes must be those.
void set_vision_language_training(VisionLanguageSettings& vl, const ResolvedRun& resolved) {
  const TrainingSpec& training = resolved.config.training;
  if (training.trains_everything()) return;
  const std::string& source = resolved.config.source;
  const ParallelConfig parallel{.micro_batch = resolved.batch.micro, .seq_length = resolved.seq_length,
                                .bytes_per_element = 4};
  std::vector<PipelineLayer> layers = pipeline_layers(vl.spec, parallel);
  try {
    apply_training(layers, vl.spec, parallel, training);
  } catch (const Error& error) {
    fail("{}: {}", source, error.what());
  }
  vl.freeze_vision = layers.front().frozen;
  if (training.lora) {
    const LoraSpec& lora = *training.lora;
    if (lora.targets != std::vector<std::string>{"c_attn"}) {
      fail("{}: lora.target = [{}]: pipeflow train's vision-language model adapts GPT-2's fused attention input "
           "c_attn alone; set lora.target to [\"c_attn\"]",
           source, fmt::join(lora.targets, ", "));
    }
    vl.lora = nn::LoraOptions{.r = lora.rank, .alpha = lora.alpha};
  }
  const int projector = vl.config.projector_layer();
  for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
    const PipelineLayer& layer = layers[static_cast<std::size_t>(i)];
    const bool frozen = i < projector ? vl.freeze_vision : i > projector && vl.lora.has_value();
    const bool adapted = vl.lora && layer.kind == LayerKind::kBlock;
    if (layer.frozen == frozen && (!adapted || layer.trainable_parameters > 0)) continue;
    fail("{}: freeze [{}]{}: layer {} would be {}: pipeflow train's vision-language model freezes its whole vision "
         "encoder or none of it (freeze [\"vision.*\"]), always trains the projector, and under LoRA adapts every "
         "language-model block's c_attn with the rest of the language model frozen (lora.train [\"projector\"], "
         "\"vision.*\" too to train the encoder); change the patterns",
         source, fmt::join(training.freeze, ", "),
         training.lora ? fmt::format(", lora.train [{}]", fmt::join(training.lora->train, ", ")) : "", layer.name,
         layer.frozen ? "frozen" : "trained");
  }
}

// What pipeflow train runs of a vision-language model, and what it refuses
// (naming the key): the model trained on threads or under mpirun
// (data_parallel replicas of its pipeline too), on its generated data. What
// the engine runs of it (whole fp32 stages keeping every activation, the
// sequence of its image tokens and a caption) StageTraits<nn::VlmStage>
// checks, called by train_settings.
VisionLanguageSettings vision_language_settings(const ResolvedRun& resolved) {
  const RunConfig& run = resolved.config;
  const std::string& source = run.source;
  const auto refuse = [&](std::string_view key_and_value, std::string_view fix) {
    fail("{}: {}: pipeflow train runs a vision-language model {}", source, key_and_value, fix);
  };
  if (!run.data.paths.empty()) {
    refuse("data.path", "on the shape captions it generates (nn/shape_captions.h); remove data.path and data.paths");
  }
  VisionLanguageSettings vl{.spec = resolved.model, .config = runtime_vlm_model(resolved.model, source)};
  if (vl.config.text.vocab_size < 256) {
    fail("{}: model vocab_size = {}: the shape captions are bytes, which need a vocabulary of at least 256; set "
         "vocab_size to 256",
         source, vl.config.text.vocab_size);
  }
  set_vision_language_training(vl, resolved);
  return vl;
}

}  // namespace

TrainSettings train_settings(const ResolvedRun& resolved) {
  const RunConfig& run = resolved.config;
  const std::string& source = run.source;
  if (run.zero != ZeroStage::kNone && run.zero != ZeroStage::kOne) {
    fail("{}: zero_optimization.stage = {}: pipeflow train shards the optimizer states (stage 1) and not yet the "
         "gradients or the weights; use 0 or 1 (pipeflow simulate models every stage)",
         source, static_cast<int>(run.zero));
  }
  if (run.comm_mode != CommMode::kOverlapped) {
    fail("{}: comm_mode = \"blocking\": pipeflow train hands messages between threads without blocking the "
         "sender; remove it (pipeflow simulate models blocking sends)",
         source);
  }
  if (run.block_launch_overhead_s > 0) {
    fail("{}: block_launch_overhead_s = {}: the host time a GPU run's block passes add, which the simulator prices; "
         "pipeflow train measures its own; remove it",
         source, run.block_launch_overhead_s);
  }
  if (run.recompute == Recompute::kSelective) {
    fail("{}: recompute = \"selective\": pipeflow train recomputes whole layers; use "
         "pipeline.activation_checkpoint_interval",
         source);
  }
  if (run.recompute == Recompute::kFull && run.pipeline.recompute_interval == 0) {
    fail("{}: recompute = \"full\" needs pipeline.activation_checkpoint_interval >= 1 (how many layers each "
         "checkpoint covers)",
         source);
  }
  if (run.grad_accum_dtype && *run.grad_accum_dtype != Precision::kFp32) {
    fail("{}: data_types.grad_accum_dtype = \"{}\": pipeflow train accumulates gradients in fp32 over its fp32 "
         "master weights; remove the key or set \"fp32\" (pipeflow simulate models 16-bit accumulation)",
         source, to_string(*run.grad_accum_dtype));
  }
  TrainSettings s;
  if (resolved.model.vision) {
    s.vision_language = vision_language_settings(resolved);
    s.model = s.vision_language->config.text;
  } else {
    if (!run.training.trains_everything()) {
      fail("{}: freeze / lora: pipeflow train trains every weight of a language model (it freezes layers and "
           "trains LoRA adapters of its vision-language model); simulate and plan price frozen layers and LoRA. "
           "Remove freeze and lora to train",
           source);
    }
    s.model = runtime_model(resolved.model, source);
    try {
      nn::validate_tensor_parallel(s.model, run.tensor_parallel);
    } catch (const Error& error) {
      fail("{}: {}", source, error.what());
    }
  }
  s.schedule = resolved.schedule;
  s.partition = run.pipeline.partition_method;
  s.hardware = run.hardware;
  s.engine.micro_batch = resolved.batch.micro;
  s.engine.data_parallel = run.data_parallel;
  s.engine.tensor_parallel = run.tensor_parallel;
  s.engine.sequence_parallel = resolved.sequence_parallel;
  s.engine.shard_optimizer = run.zero == ZeroStage::kOne;
  s.engine.reduce_bucket_size = run.reduce_bucket_size;
  s.engine.seq_length = resolved.seq_length;
  s.engine.recompute_interval = run.pipeline.recompute_interval;
  s.engine.optimizer = adamw_options(run.optimizer);
  s.engine.lr_schedule = lr_schedule(run.scheduler, run.optimizer.lr);
  s.engine.gradient_clipping = run.gradient_clipping;
  s.engine.noise_scale_interval = run.metrics.noise_scale_interval;
  s.engine.format = run.precision == Precision::kBf16   ? ComputeFormat::kBf16
                    : run.precision == Precision::kFp16 ? ComputeFormat::kFp16
                                                        : ComputeFormat::kFp32;
  if (run.precision == Precision::kFp16) s.engine.loss_scale = run.loss_scale;
  if (s.vision_language) {  // what the engine runs of a VLM, checked before anything is built
    try {
      StageTraits<nn::VlmStage>::validate({.model = s.vision_language->config}, s.engine, run.tensor_parallel);
    } catch (const Error& error) {
      fail("{}: {}", source, error.what());
    }
  }
  for (const std::string& path : run.data.paths) {
    std::error_code unreadable;  // a name too long, a loop of links: not there
    const bool there = std::filesystem::exists(path, unreadable);
    if (!there || std::filesystem::is_directory(path, unreadable)) {
      fail("{}: data path {} is {}: name text files, or leave data out for the fortunes corpus", source,
           quoted_excerpt(path), there ? "a directory" : "not there");
    }
  }
  s.data.assign(run.data.paths.begin(), run.data.paths.end());
  s.validation_fraction = run.data.validation_fraction;
  s.steps = run.steps;
  s.seed = run.seed;
  s.eval_interval = run.eval_interval;
  s.out_dir = run.out_dir;
  s.save_interval = run.checkpoint.save_interval;
  s.steps_per_print = resolved.steps_per_print;
  s.checkpoint_keep = run.checkpoint.keep;
  s.max_skipped_steps = run.numerics.max_skipped_steps;
  s.checkpoint_dir = resolved.checkpoint_dir;
  s.resume = run.checkpoint.load;
  s.config_text = run_config_to_json(run);
  s.config = run;
  s.config_source = source;
  return s;
}

}  // namespace pipeflow::runtime
