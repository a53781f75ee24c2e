#include "train/run_kind.h"

#include <fmt/format.h>

#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/core/units.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/model/training.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/nn/sampling.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "pipeflow/runtime/stage_partition.h"

namespace pipeflow::runtime {
namespace {

// A partition that does not fit, named by the run's key.
[[noreturn]] void fail_partition(const TrainSettings& settings, const Error& error) {
  const Schedule& schedule = settings.schedule;
  fail("{}: pipeline.stages = {} with {} ({} stages): {}", settings.config_source, schedule.num_ranks(),
       schedule.name(), schedule.num_stages(), error.what());
}

// " in bf16", " in fp16, dynamic loss scale from 2^16"; "" in fp32.
std::string precision_text(const EngineOptions& e) {
  if (e.format == ComputeFormat::kFp32) return "";
  if (!e.loss_scale) return fmt::format(" in {}", to_string(e.format));
  const LossScaleConfig& scale = *e.loss_scale;
  return scale.loss_scale > 0 ? fmt::format(" in fp16, static loss scale {:g}", scale.loss_scale)
                              : fmt::format(" in fp16, dynamic loss scale from 2^{}", scale.initial_scale_power);
}

// The VLM's stages' boundaries: settings.partition over the model's layers
// as the model module counts them, frozen ones as frozen.
std::vector<int> vlm_stage_boundaries(const TrainSettings& settings) {
  const VisionLanguageSettings& vl = *settings.vision_language;
  const ParallelConfig parallel{.micro_batch = settings.engine.micro_batch,
                                .seq_length = settings.engine.seq_length,
                                .bytes_per_element = 4};
  std::vector<PipelineLayer> layers = pipeline_layers(vl.spec, parallel);
  apply_training(layers, vl.spec, parallel, settings.config.training);
  try {
    return partition_layers(layers, settings.schedule.num_stages(), settings.partition, settings.hardware).boundaries;
  } catch (const Error& error) {
    fail_partition(settings, error);
  }
}

std::string vlm_stage_text(const nn::VlmConfig& config, const std::vector<int>& boundaries) {
  std::string text;
  for (std::size_t s = 0; s + 1 < boundaries.size(); ++s) {
    text += fmt::format("{}stage {}: {}..{}", s == 0 ? "" : ", ", s, nn::vlm_layer_name(config, boundaries[s]),
                        nn::vlm_layer_name(config, boundaries[s + 1] - 1));
  }
  return text;
}

// "vision-language model (ViT 1 x 32, 16 image tokens; GPT-2 2 x 32), vision encoder frozen"
std::string vlm_description(const VisionLanguageSettings& vl) {
  const nn::VlmConfig& c = vl.config;
  return fmt::format("vision-language model (ViT {} x {}, {} image tokens; GPT-2 {} x {}){}{}", c.vision.layers,
                     c.vision.width, c.vision.tokens(), c.text.n_layer, c.text.n_embd,
                     vl.freeze_vision ? ", vision encoder frozen" : "",
                     vl.lora ? fmt::format(", LoRA r = {} alpha = {:g} on c_attn", vl.lora->r, vl.lora->alpha) : "");
}

}  // namespace

// --- A GPT-2 or Llama ---

RunKind<nn::Stage>::RunKind(const TrainSettings& settings)
    : settings_(settings),
      dataset_(settings.data.empty() ? nn::ByteDataset::default_corpus() : settings.data,
               {.seq_length = settings.engine.seq_length, .seed = settings.seed,
                .validation_fraction = settings.validation_fraction}),
      source_(dataset_, nn::Split::kTrain) {}

std::unique_ptr<PipelineEngine> RunKind<nn::Stage>::make_engine(RankGroup& group) const {
  dataset_.check_vocabulary(settings_.model.vocab_size);
  const Schedule& schedule = settings_.schedule;
  const EngineOptions& options = settings_.engine;
  std::vector<int> boundaries;
  try {
    boundaries = partition_model(settings_.model, schedule.num_stages(), settings_.partition, options.micro_batch,
                                 options.seq_length, settings_.hardware);
  } catch (const Error& error) {
    fail_partition(settings_, error);
  }
  auto engine = std::make_unique<PipelineEngine>(settings_.model, schedule, boundaries, options, group);
  if (settings_.weights.empty()) return engine;
  if (!settings_.resume.empty()) {
    fail("--weights {} and checkpoint.load {}: a checkpoint holds the weights; give one of the two",
         settings_.weights.string(), settings_.resume.string());
  }
  engine->load_parameters(read_checkpoint(settings_.weights));  // a file, or a sharded folder or its index
  return engine;
}

std::string RunKind<nn::Stage>::announcement(const PipelineEngine& engine) const {
  const Schedule& s = engine.schedule();
  return fmt::format("pipeflow train: {} ({} parameters){}; {} on {} ({}), {} of {} x {} tokens; {}{}",
                     nn::describe(settings_.model), settings_.model.parameter_count(), precision_text(settings_.engine),
                     s.name(), format_count(s.num_ranks(), "rank"), format_count(s.num_stages(), "stage"),
                     format_count(s.num_microbatches(), "micro-batch", "micro-batches"), settings_.engine.micro_batch,
                     settings_.engine.seq_length, format_count(settings_.steps, "step"),
                     settings_.emulate ? ", emulated" : "");
}

double RunKind<nn::Stage>::validation_loss(nn::Stage& model) const {
  const int b = settings_.engine.micro_batch;
  const int microbatches = settings_.schedule.num_microbatches() * settings_.engine.data_parallel;  // of every replica
  double total = 0;
  for (int j = 0; j < microbatches; ++j) {
    nn::Batch batch = dataset_.batch(nn::Split::kValidation, 0, static_cast<std::int64_t>(j) * b, b,
                                     model.allocator());
    nn::MicrobatchState state;
    model.forward(state, {.tokens = std::move(batch.inputs), .targets = std::move(batch.targets)});
    total += state.loss();
  }
  return total / microbatches;
}

void RunKind<nn::Stage>::finish(TrainOutcome& outcome, nn::Stage& model) const {
  outcome.sample =
      nn::sample_text(model, "", {.new_tokens = settings_.sample_tokens, .temperature = 0.8, .seed = settings_.seed});
}

std::string RunKind<nn::Stage>::data() const {
  return fmt::format("{} ({} training bytes)", dataset_.source(), dataset_.bytes(nn::Split::kTrain));
}

std::string RunKind<nn::Stage>::model(const nn::Stage&) const {
  const nn::ModelConfig& m = settings_.model;
  return fmt::format("{}: {} parameters{}", nn::describe(m), m.parameter_count(),
                     settings_.weights.empty()
                         ? fmt::format(" ({} initialisation, seed {})", m.llama() ? "Llama" : "GPT-2", settings_.seed)
                         : fmt::format(" (from {})", settings_.weights.string()));
}

std::string RunKind<nn::Stage>::sample_note(const TrainOutcome& outcome) const {
  return fmt::format("{} bytes generated from the final weights at temperature 0.8", outcome.sample.size());
}

std::string RunKind<nn::Stage>::weights_note() const {
  return fmt::format("the final weights (Hugging Face {} names)", settings_.model.llama() ? "Llama" : "GPT-2");
}

void RunKind<nn::Stage>::write_weights(const std::filesystem::path& path, const nn::Stage& model) const {
  nn::write_weights(path, model, settings_.engine.format);
}

// --- The vision-language model ---

std::unique_ptr<VlmPipelineEngine> RunKind<nn::VlmStage>::make_engine(RankGroup& group) const {
  const VisionLanguageSettings& vl = *settings_.vision_language;
  if (settings_.emulate) fail("--emulate: a vision-language model trains on threads only; drop --emulate");
  if (!settings_.weights.empty()) {
    fail("--weights {}: a vision-language model trains from its initialisation or its checkpoint "
         "(checkpoint.load); drop --weights",
         settings_.weights.string());
  }
  return std::make_unique<VlmPipelineEngine>(
      VlmTraining{.model = vl.config, .freeze_vision = vl.freeze_vision, .lora = vl.lora}, settings_.schedule,
      vlm_stage_boundaries(settings_), settings_.engine, group);
}

std::string RunKind<nn::VlmStage>::announcement(const VlmPipelineEngine& engine) const {
  const Schedule& schedule = engine.schedule();
  return fmt::format("pipeflow train: {}; {} on {} ({}: {}), {} of {} images and captions; {} on the generated "
                     "shape captions",
                     vlm_description(*settings_.vision_language), schedule.name(),
                     format_count(schedule.num_ranks(), "rank"), format_count(schedule.num_stages(), "stage"),
                     vlm_stage_text(settings_.vision_language->config, engine.boundaries()),
                     format_count(schedule.num_microbatches(), "micro-batch", "micro-batches"),
                     settings_.engine.micro_batch, format_count(settings_.steps, "step"));
}

double RunKind<nn::VlmStage>::validation_loss(nn::VlmStage& model) const {
  // The held-out loss over as many samples as a step trains on, a micro-batch at a time.
  const int microbatches = settings_.schedule.num_microbatches() * settings_.engine.data_parallel;
  return nn::held_out_loss(model, data_, microbatches, settings_.engine.micro_batch);
}

void RunKind<nn::VlmStage>::finish(TrainOutcome& outcome, nn::VlmStage& model) const {
  outcome.captions = nn::score_captions(model, data_, settings_.vision_language->caption_images);
  outcome.sample = outcome.captions->generated;
}

std::string RunKind<nn::VlmStage>::data() const {
  return fmt::format("the generated shape captions (nn/shape_captions.h), seed {}", settings_.seed);
}

std::string RunKind<nn::VlmStage>::model(const nn::VlmStage& model) const {
  return fmt::format("{}: {} parameters, {} of them trained (initialisation seed {})",
                     vlm_description(*settings_.vision_language),
                     model.layout().total() + model.frozen_layout().total(), model.layout().total(), settings_.seed);
}

std::string RunKind<nn::VlmStage>::sample_note(const TrainOutcome& outcome) const {
  const nn::CaptionScore& c = *outcome.captions;
  return fmt::format("Held-out image 0 (\"{}\") captioned greedily by the final weights; {} of {} held-out images "
                     "captioned right (chance 1 in {:g})",
                     c.expected, c.right, c.images, 1 / nn::CaptionScore::kChance);
}

std::string RunKind<nn::VlmStage>::weights_note() const {
  return "the final weights, trained and frozen, by name (no model header)";
}

void RunKind<nn::VlmStage>::write_weights(const std::filesystem::path& path, const nn::VlmStage& model) const {
  nn::SafetensorsWriter writer;
  for (const nn::ParameterLayout* layout : StageTraits<nn::VlmStage>::saved_layouts(model)) {
    for (const nn::ParameterInfo& info : layout->entries()) {
      writer.add(info.name, model.parameter(info.name), info.shape);
    }
  }
  writer.write(path);
}

}  // namespace pipeflow::runtime
