#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pipeflow/config/run_config.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/model/partition.h"
#include "pipeflow/nn/model_config.h"
#include "pipeflow/nn/vision_language_model.h"
#include "pipeflow/runtime/engine_options.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow::runtime {

class ProgressPrinter;
class RankGroup;

// Everything a training run needs, as plain values (`pipeflow train` fills
// them from the run configuration and the command line).
// A vision-language model to train instead of a language model
// (runtime_vlm_model), on the generated shape captions (nn/shape_captions.h,
// seeded by TrainSettings::seed): its spec (the layers the partition cuts),
// nn's shape and what trains (the configuration's freeze and lora, as
// run_settings.h maps them).
struct VisionLanguageSettings {
  ModelSpec spec;
  nn::VlmConfig config;
  bool freeze_vision = false;
  std::optional<nn::LoraOptions> lora = std::nullopt;
  int caption_images = 64;  // held-out images captioned at the end
};

struct TrainSettings {
  nn::ModelConfig model;
  // Set: the model is this vision-language model (`model` is its language
  // model); see train() for what such a run writes.
  std::optional<VisionLanguageSettings> vision_language = std::nullopt;
  // What runs (ResolvedRun::schedule): its ranks p, chunks per rank v and
  // micro-batches per step and replica m.
  Schedule schedule = make_schedule("1f1b", 1, 1);
  PartitionMethod partition;
  HardwareProfile hardware;  // prices the layers for the "balanced" partition
  // micro_batch, seq_length (T), checkpoint interval, optimizer, LR
  // schedule, clipping, timeout.
  EngineOptions engine;
  std::vector<std::filesystem::path> data;  // empty: the fortunes corpus
  double validation_fraction = 0.1;
  int steps = 100;
  std::uint64_t seed = 1234;  // weights (unless `weights`) and data
  int eval_interval = 10;     // steps between validation losses; 0: only at the end
  int steps_per_print = 1;    // steps between plain progress lines (ProgressPrinter)
  std::filesystem::path out_dir = "runs/pipeflow";
  std::filesystem::path weights;  // start from this whole-model file (pipeflow init); empty: the family's initialisation
  // Checkpoints (PipelineEngine::write_checkpoint): every save_interval
  // steps and after the last one (0: none), as checkpoint_dir/step_N.safetensors,
  // under MPI the folder checkpoint_dir/step_N of shards and their index
  // (checkpoint_search.h; N: steps done).
  // `resume`: a checkpoint file or folder, its index file, a directory or a
  // run's out_dir (checkpoints_to_resume): the newest
  // checkpoint that loads, with a warning for each newer one that does not;
  // the run continues from its steps_done up to `steps` (the total) on the
  // same data and learning-rate schedule as an uninterrupted run. After each
  // checkpoint written, all but the newest `checkpoint_keep` of this run's
  // checkpoints in the directory (its run id in their headers, ranked by the
  // steps they hold; none holding more steps than the one written) are
  // deleted (0: none); another run's files and a user's are never touched.
  // At the start, temporaries of killed writers (NAME.pipeflow-tmp.PID) are
  // removed from the directory, its step_N folders and out_dir.
  int save_interval = 0;
  int checkpoint_keep = 0;
  std::filesystem::path checkpoint_dir = "runs/pipeflow/checkpoints";
  std::filesystem::path resume;
  // The folders are the run's own (train/run_folders.h): a fresh run into
  // folders that hold another run's files, or a resumed one into an out_dir
  // another run owns, is refused unless `overwrite`, which removes those
  // files first.
  bool overwrite = false;
  // A step whose loss or gradient norm is not finite is skipped (no update);
  // this many skipped in a row stop the run with an Error naming the step
  // and the first non-finite tensor.
  int max_skipped_steps = 3;

  bool emulate = false;           // run serially and replay (RunMode::kSerial)
  int cost_steps = 3;             // steps after the first whose action costs feed the prediction
  std::string config_text;        // the run configuration, for the report and run_config.json
  RunConfig config;               // the same, as parsed (with flags applied): the trace's run metadata (sim/run_metadata.h)
  std::string config_source;      // where it came from
  int sample_tokens = 200;        // the text sample at the end
};

// One line of metrics.jsonl.
struct StepLog {
  std::int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_time_s = 0;  // measured (emulated: the replayed step)
  double step_time_predicted_s = 0;
  double tokens_per_s = 0;
  double tokens_per_s_predicted = 0;
  double bubble_measured = 0;
  double bubble_predicted = 0;
  // The step's speedup over one core doing the same work, as a fraction of
  // the ideal p × (1 − bubble_predicted): Σ_r (compute_r − off_core_r +
  // optimizer_r) / (p · (1 − bubble_predicted) · step_time_s). 1: the
  // pipeline ran as fast as its schedule allows; the rest is waiting the
  // schedule does not explain, hand-offs, the flush, and time a rank's
  // thread lost its core to other work (off_core_s). The one-core time is
  // the actions' CPU time in this run: a load that slows the core itself is
  // not seen here (bench/runtime_pipeline.cc measures a separate 1-stage
  // engine).
  double ideal_fraction = 0;
  // Per rank, in the pipeline part of the step: compute (F/B/I/W), idle
  // (makespan − compute), communication (SEND/RECV outside their waits) and
  // the part of compute the rank's thread was off its core
  // (RankFigures::off_core_s) and of its blocked receives after the peer's
  // send had ended (RankFigures::wake_s), measured, and predicted where the
  // simulator prices it (its hand-offs are free, its cores never taken).
  std::vector<double> busy_s, busy_predicted_s, idle_s, idle_predicted_s, comm_s, off_core_s, wake_s;
  // Per rank under MPI with d > 1 (else empty): the data-parallel reduction
  // and its part before the rank's last pipeline action ended (RankFigures).
  std::vector<double> data_parallel_s, data_parallel_early_s;
  // Per rank with tensor parallelism (else empty): its tensor-parallel
  // collectives' time, measured and as the simulator prices them
  // (RankFigures, predicted_tensor_parallel_s).
  std::vector<double> tensor_parallel_s, tensor_parallel_predicted_s;
  std::vector<std::int64_t> peak_activation_bytes;  // per rank, measured
  std::vector<std::int64_t> peak_activation_bytes_predicted;  // per rank, the simulator's memory walk
  std::optional<double> val_loss;
  bool skipped = false;  // the loss or grad_norm was not finite: no update (StepResult::skipped)
  // fp16 (else none): the loss scale the step ran with, the next step's, and
  // whether its skip was an overflow the scaler absorbs (not a sign of
  // divergence).
  std::optional<double> loss_scale = std::nullopt;
  double next_loss_scale = 1;
  bool overflow = false;
  // The gradient noise scale (runtime/noise_scale.h), on the steps that
  // measure it (metrics.noise_scale_interval) and were not skipped:
  // |G_small|²: the mean-loss gradient of one micro-batch (b sequences);
  // |G_big|² = grad_norm²: of the global batch (m · b · d sequences).
  std::optional<double> grad_square_small = std::nullopt;
  std::optional<double> grad_square_big = std::nullopt;
  // B_simple in sequences from the moving averages of this run's measurements
  // up to this step; none while the averaged |G|² is not positive.
  std::optional<double> noise_scale = std::nullopt;
};

struct TrainOutcome {
  std::vector<StepLog> log;
  std::string sample;  // generated text at the end (a vision-language model: the first held-out image's caption)
  std::optional<nn::CaptionScore> captions = std::nullopt;  // a vision-language model's held-out captions
  std::vector<std::filesystem::path> files;  // what was written to out_dir
  int stop_signal = 0;  // the signal `stop` held after the last step run, 0: none
};

// Set to a signal's number (by a signal handler: the atomic is lock-free, so
// storing to it is async-signal-safe) to stop a run after its current step.
using StopRequest = std::atomic<int>;
static_assert(StopRequest::is_always_lock_free);

// Trains: builds the data, the schedule, the partition and the pipeline
// engine, runs `steps` steps, validates every eval_interval steps and after
// the last, and writes into out_dir:
//   metrics.jsonl       one JSON object per step (StepLog; rewritten
//                       atomically at each validation, each checkpoint
//                       and the end)
//   report.md           configuration, partition, per-rank measured vs predicted,
//                       bubble, memory, tokens/s, loss curve, the sample
//   timeline.svg        the last step's pipeline, measured (emulated with --emulate)
//   trace.json          the same step with the flush after it (Chrome trace)
//   predicted.svg       the same step as the measured costs predict it
//   profile.json        those costs (sim/profile.h): pipeflow simulate --profile reads it
//   weights.safetensors the final weights (whole model, pipeflow init's format)
// and the checkpoints (above). A run resumed into the out_dir of the run it
// continues keeps that run's metrics.jsonl lines before its first step;
// report.md covers the steps this run made.
// When `stop` holds a signal number after a step, the run ends there: it
// writes a checkpoint of the steps done and the files above (no validation,
// no further step) and returns with stop_signal set.
// Progress goes to `progress`. Throws Error for a bad setting (naming it),
// for max_skipped_steps non-finite steps in a row and for any failure of the
// pipeline.
// On `group`'s ranks (pipeline.stages × data_parallel of them): every
// process of the group calls train() with the same settings; the process of
// world rank 0 alone prints and writes the files, and its outcome alone
// holds the full log and the sample.
TrainOutcome train(const TrainSettings& settings, ProgressPrinter& progress, const StopRequest* stop,
                   RankGroup& group);
// On threads of this process.
TrainOutcome train(const TrainSettings& settings, ProgressPrinter& progress, const StopRequest* stop = nullptr);

}  // namespace pipeflow::runtime
