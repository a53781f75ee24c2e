#include "train/vision_language_run.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/units.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/model/training.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/runtime/engine.h"
#include "train/metrics_log.h"
#include "train/run_folders.h"

namespace pipeflow::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// The stages' boundaries: settings.partition over the model's layers as
// the model module counts them, frozen ones as frozen.
std::vector<int> stage_boundaries(const TrainSettings& settings) {
  const VisionLanguageSettings& vl = *settings.vision_language;
  const ParallelConfig parallel{.micro_batch = settings.engine.micro_batch,
                                .seq_length = settings.engine.seq_length,
                                .bytes_per_element = 4};
  std::vector<PipelineLayer> layers = pipeline_layers(vl.spec, parallel);
  apply_training(layers, vl.spec, parallel, settings.config.training);
  std::vector<int> boundaries;
  try {
    boundaries = partition_layers(layers, settings.schedule.num_stages(), settings.partition, settings.hardware)
                     .boundaries;
  } catch (const Error& error) {
    fail("{}: pipeline.stages = {} with {} ({} stages): {}", settings.config_source, settings.schedule.num_ranks(),
         settings.schedule.name(), settings.schedule.num_stages(), error.what());
  }
  return boundaries;
}

// The mean loss over the held-out split's first step, as many samples as a training step.
double validation_loss(nn::VlmStage& model, const nn::ShapeCaptions& data, int samples) {
  nn::ShapeCaptions::Batch batch = data.batch(nn::Split::kValidation, 0, 0, samples, model.allocator());
  nn::VlmState state;
  model.forward(state, {.images = std::move(batch.images),
                        .activation = {},
                        .tokens = std::move(batch.tokens),
                        .targets = std::move(batch.targets)});
  return state.loss();
}

void write_weights(nn::VlmStage& model, const std::filesystem::path& path) {
  nn::SafetensorsWriter writer;
  for (const nn::ParameterLayout* layout : {&model.layout(), &model.frozen_layout()}) {
    for (const nn::ParameterInfo& info : layout->entries()) {
      writer.add(info.name, std::as_const(model).parameter(info.name), info.shape);
    }
  }
  writer.write(path);
}

std::string stage_text(const nn::VlmConfig& config, const std::vector<int>& boundaries) {
  std::string text;
  for (std::size_t s = 0; s + 1 < boundaries.size(); ++s) {
    text += fmt::format("{}stage {}: {}..{}", s == 0 ? "" : ", ", s, nn::vlm_layer_name(config, boundaries[s]),
                        nn::vlm_layer_name(config, boundaries[s + 1] - 1));
  }
  return text;
}

}  // namespace

TrainOutcome train_vision_language(const TrainSettings& settings, ProgressPrinter& progress,
                                   const StopRequest* stop, RankGroup& group) {
  const VisionLanguageSettings& vl = *settings.vision_language;
  const EngineOptions& e = settings.engine;
  if (settings.emulate) fail("--emulate: a vision-language model trains on threads only; drop --emulate");
  if (!settings.weights.empty()) {
    fail("--weights {}: a vision-language model trains from its initialisation; drop --weights",
         settings.weights.string());
  }
  const std::vector<int> boundaries = stage_boundaries(settings);
  VlmPipelineEngine engine({.model = vl.config, .freeze_vision = vl.freeze_vision, .lora = vl.lora},
                           settings.schedule, boundaries, e, group);
  engine.init_parameters(settings.seed);
  const RunFolders folders(settings);
  for (const auto& removed : remove_stale_temporaries(settings.out_dir)) {
    progress.message(fmt::format("removed {}: a temporary file left by a writer that was stopped", removed.string()));
  }
  for (const std::filesystem::path& removed : folders.claim(run_id_text(new_run_id()), false)) {
    progress.message(fmt::format("removed {}: another run's (--overwrite)", removed.string()));
  }
  const Schedule& schedule = engine.schedule();
  const auto samples = static_cast<int>(engine.global_batch());
  const nn::VlmConfig& c = vl.config;
  progress.message(fmt::format(
      "pipeflow train: vision-language model (ViT {} x {}, {} image tokens; GPT-2 {} x {}){}{}; {} on {} ({}: {}), "
      "{} of {} images and captions; {} on the generated shape captions",
      c.vision.layers, c.vision.width, c.vision.tokens(), c.text.n_layer, c.text.n_embd,
      vl.freeze_vision ? ", vision encoder frozen" : "",
      vl.lora ? fmt::format(", LoRA r = {} alpha = {:g} on c_attn", vl.lora->r, vl.lora->alpha) : "",
      schedule.name(), format_count(schedule.num_ranks(), "rank"), format_count(schedule.num_stages(), "stage"),
      stage_text(c, boundaries), format_count(schedule.num_microbatches(), "micro-batch", "micro-batches"),
      e.micro_batch, format_count(settings.steps, "step")));
  const nn::ShapeCaptions data(settings.seed);
  TrainOutcome outcome;
  const Clock::time_point start = Clock::now();
  for (int step = 0; step < settings.steps; ++step) {
    const StepResult result = engine.step(step, data);
    if (!std::isfinite(result.loss) || !std::isfinite(result.grad_norm)) {
      fail("step {}: loss {}, gradient norm {}: the run diverged; lower optimizer.params.lr or set "
           "gradient_clipping",
           step, result.loss, result.grad_norm);
    }
    StepLog log;
    log.traced = false;
    log.step = step;
    log.loss = result.loss;
    log.lr = result.lr;
    log.grad_norm = result.grad_norm;
    log.step_time_s = result.wall_s;
    log.tokens_per_s = static_cast<double>(result.tokens) / result.wall_s;
    const bool last = step + 1 == settings.steps;
    if (last || (settings.eval_interval > 0 && (step + 1) % settings.eval_interval == 0)) {
      log.val_loss = validation_loss(*engine.assemble_model(), data, samples);
    }
    progress.step(log, std::chrono::duration<double>(Clock::now() - start).count());
    outcome.log.push_back(std::move(log));
    if (stop != nullptr && stop->load() != 0) {
      outcome.stop_signal = stop->load();
      break;
    }
  }
  progress.finish();
  const std::unique_ptr<nn::VlmStage> model = engine.assemble_model();
  if (!outcome.log.back().val_loss) outcome.log.back().val_loss = validation_loss(*model, data, samples);
  outcome.captions = nn::score_captions(*model, data, vl.caption_images);
  outcome.sample = outcome.captions->generated;
  std::filesystem::create_directories(settings.out_dir);
  write_file_atomic(settings.out_dir / "metrics.jsonl", metrics_jsonl(outcome.log));
  write_file_atomic(settings.out_dir / "run_config.json", settings.config_text);
  write_weights(*model, settings.out_dir / "weights.safetensors");
  for (const char* name : {"metrics.jsonl", "run_config.json", "weights.safetensors"}) {
    outcome.files.push_back(settings.out_dir / name);
  }
  return outcome;
}

}  // namespace pipeflow::runtime
