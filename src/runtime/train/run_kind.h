#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "pipeflow/nn/byte_dataset.h"
#include "pipeflow/nn/shape_captions.h"
#include "pipeflow/runtime/batch_source.h"
#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/trainer.h"

namespace pipeflow::runtime {

// What a training run (trainer.cc's Run<StageT>) does differently for each
// kind of stage, in one place per kind: its data and the engine's source of
// them, the engine built on the run's partition (with the kind's refusals),
// the announcement's first line, the validation loss, what the run ends
// with (a text sample, or the held-out captions) and the words and weights
// file of the report. Everything else (steps, measurement and prediction,
// checkpoints and resume, metrics, trace and report) is one body for both.
template <class StageT>
class RunKind;

// A GPT-2 or Llama on a byte corpus (settings.data; empty: the fortunes).
template <>
class RunKind<nn::Stage> {
 public:
  explicit RunKind(const TrainSettings& settings);
  // --emulate replays its actions one at a time (a pipeline's, not its replicas').
  static constexpr bool kEmulates = true;
  const DatasetSource& source() const { return source_; }
  // The engine on settings.partition's cut, its weights from settings.weights
  // when given (refused beside settings.resume); else they stay zero for
  // the run to initialise or resume.
  std::unique_ptr<PipelineEngine> make_engine(RankGroup& group) const;
  std::string announcement(const PipelineEngine& engine) const;
  // The mean loss over one global batch of the validation split (the same
  // samples at every evaluation, so the losses are comparable).
  double validation_loss(nn::Stage& model) const;
  // The sample text generated from the final weights.
  void finish(TrainOutcome& outcome, nn::Stage& model) const;
  std::string data() const;
  std::string model(const nn::Stage& model) const;
  std::string sample_note(const TrainOutcome& outcome) const;
  std::string weights_note() const;
  std::string layer_name(int layer) const { return nn::pipeline_layer_name(settings_.model, layer); }
  void write_weights(const std::filesystem::path& path, const nn::Stage& model) const;

 private:
  const TrainSettings& settings_;
  nn::ByteDataset dataset_;
  DatasetSource source_;
};

// The vision-language model (settings.vision_language) on the generated
// shape captions of settings.seed (the same in every process): fp32, no
// --weights or --emulate (refused naming them). Its validation loss is the held-out
// split's first step of as many samples as a training step; at the end it
// captions vision_language->caption_images held-out images
// (TrainOutcome::captions; the sample is the first one's caption). Its
// weights file holds every tensor, trained and frozen, by name (no model
// header: it is not a language model's weights file).
template <>
class RunKind<nn::VlmStage> {
 public:
  explicit RunKind(const TrainSettings& settings) : settings_(settings), data_(settings.seed) {}
  static constexpr bool kEmulates = false;
  const nn::ShapeCaptions& source() const { return data_; }
  std::unique_ptr<VlmPipelineEngine> make_engine(RankGroup& group) const;
  std::string announcement(const VlmPipelineEngine& engine) const;
  double validation_loss(nn::VlmStage& model) const;
  void finish(TrainOutcome& outcome, nn::VlmStage& model) const;
  std::string data() const;
  std::string model(const nn::VlmStage& model) const;
  std::string sample_note(const TrainOutcome& outcome) const;
  std::string weights_note() const;
  std::string layer_name(int layer) const { return nn::vlm_layer_name(settings_.vision_language->config, layer); }
  void write_weights(const std::filesystem::path& path, const nn::VlmStage& model) const;

 private:
  const TrainSettings& settings_;
  nn::ShapeCaptions data_;
};

}  // namespace pipeflow::runtime
