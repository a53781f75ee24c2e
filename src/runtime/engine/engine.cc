#include "pipeflow/runtime/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <exception>
#include <map>
#include <set>
#include <sstream>
#include <mutex>
#include <optional>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/gradient_clipping.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/parameter_layout.h"
#include "pipeflow/nn/safetensors_index.h"
#include "pipeflow/schedule/passes.h"
#include "pipeflow/runtime/in_process_transport.h"
#include "pipeflow/runtime/mpi_transport.h"
#include "pipeflow/runtime/mpi_world.h"
#include "pipeflow/runtime/rank_threads.h"
#include "pipeflow/runtime/report.h"
#include "pipeflow/schedule/validate.h"

namespace pipeflow::runtime {
namespace {

// The schedule is checked as given before it is lowered: lowering an invalid
// one would bury its violations under the SEND/RECV it got wrong (a stage on
// two ranks read from a CSV) or fail as a deadlock without naming the cause.
Schedule lowered_and_valid(const Schedule& schedule) {
  const ValidationReport report = validate(schedule);
  if (!report.ok()) fail("schedule {} cannot run:\n{}", schedule.name(), report.render(schedule));
  if (schedule.has_communication()) return schedule;
  Schedule lowered = insert_send_recv(schedule);
  const ValidationReport lowered_report = validate(lowered);
  if (!lowered_report.ok()) {
    fail("schedule {} cannot run once lowered:\n{}", schedule.name(), lowered_report.render(lowered));
  }
  return lowered;
}

void check_boundaries(const nn::GptConfig& config, const Schedule& schedule, const std::vector<int>& b) {
  const int layers = config.pipeline_layers();
  const int stages = schedule.num_stages();
  if (static_cast<int>(b.size()) != stages + 1) {
    fail("partition has {} boundaries for {} stages: needs stages + 1 = {} (0 … {})", b.size(), stages, stages + 1,
         layers);
  }
  if (b.front() != 0 || b.back() != layers) {
    fail("partition boundaries [{}] must run from 0 to the model's {} pipeline layers", fmt::join(b, ", "), layers);
  }
  for (std::size_t i = 1; i < b.size(); ++i) {
    if (b[i] <= b[i - 1]) {
      fail("partition boundaries [{}] must increase: stage {} would hold no layer (a schedule of {} stages needs "
           "at least {} pipeline layers)",
           fmt::join(b, ", "), i - 1, stages, stages);
    }
  }
}

// The first non-finite value of `values` within the tensors of `layout`,
// among elements [part.begin, part.end): the tensor's name.
std::optional<std::string> non_finite_tensor(const nn::ParameterLayout& layout, std::span<const float> values,
                                             nn::OptimizerShard part) {
  for (const nn::ParameterInfo& info : layout.entries()) {
    const std::int64_t from = std::max(part.begin, info.offset);
    const std::int64_t to = std::min(part.end, info.offset + info.numel());
    if (to <= from) continue;
    const auto tensor = values.subspan(static_cast<std::size_t>(from), static_cast<std::size_t>(to - from));
    if (!std::all_of(tensor.begin(), tensor.end(), [](float v) { return std::isfinite(v); })) return info.name;
  }
  return std::nullopt;
}

// A non-finite loss must skip the update on every rank, but only the rank of
// the last stage sees it: it joins the all-reduced square sum as 0 · loss,
// which is +0 for a finite loss (the sum keeps its bits) and NaN otherwise.
double loss_guard(const RankWorker& w, int microbatches) {
  if (!w.holds_last_stage()) return 0;
  double guard = 0;
  for (int j = 0; j < microbatches; ++j) guard += 0.0 * w.microbatch_loss(j);
  return guard;
}

}  // namespace

std::vector<int> inbox_capacities(const Schedule& schedule) {
  std::vector<int> capacity(static_cast<std::size_t>(schedule.num_ranks()), 1);  // + the tied gradient
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    for (const Action& a : schedule.actions(RankId(r))) {
      if (is_recv(a.kind)) ++capacity[static_cast<std::size_t>(r)];
    }
  }
  return capacity;
}

PipelineEngine::PipelineEngine(const nn::GptConfig& config, const Schedule& schedule, std::vector<int> boundaries,
                               EngineOptions options, const MpiGroups* processes)
    : config_(config),
      schedule_(lowered_and_valid(schedule)),
      boundaries_(std::move(boundaries)),
      options_(std::move(options)),
      processes_(processes),
      progress_(static_cast<std::size_t>(schedule_.num_ranks())) {
  config_.validate();
  check_boundaries(config_, schedule_, boundaries_);
  if (options_.micro_batch < 1) fail("train_micro_batch_size_per_gpu = {}: must be >= 1", options_.micro_batch);
  if (options_.seq_length < 1 || options_.seq_length > config_.context) {
    fail("seq_length {} must lie in [1, {}] (the model's context)", options_.seq_length, config_.context);
  }
  if (options_.timeout.count() <= 0) fail("timeout = {} s: must be > 0", options_.timeout.count());
  std::vector<RankId> local;
  if (processes_ != nullptr) {
    const RankLayout& layout = processes_->layout();
    if (layout.pipeline != schedule_.num_ranks()) {
      fail("the processes form pipelines of {} ranks and schedule {} has {}", layout.pipeline, schedule_.name(),
           schedule_.num_ranks());
    }
    options_.data_parallel = layout.data_parallel;
    options_.data_rank = processes_->data_rank();
    local.push_back(RankId(processes_->pipeline_rank()));
    transport_ = std::make_unique<MpiTransport>(processes_->pipeline(), local.front(), schedule_.num_stages(),
                                                schedule_.num_microbatches());
  } else {
    if (options_.data_parallel != 1) {
      fail("data_parallel = {} in one process: data-parallel replicas are MPI processes; run mpirun -np {} "
           "pipeflow train ...",
           options_.data_parallel, options_.data_parallel * schedule_.num_ranks());
    }
    for (int r = 0; r < schedule_.num_ranks(); ++r) local.push_back(RankId(r));
    // Spinning pays only when each rank has a core of its own (RankThreads pins them then).
    const auto spin = schedule_.num_ranks() <= usable_cores() ? kHandoffSpin : std::chrono::nanoseconds(0);
    transport_ = std::make_unique<InProcessTransport>(inbox_capacities(schedule_), spin);
  }
  stages_.resize(static_cast<std::size_t>(schedule_.num_stages()));
  optimizers_.resize(stages_.size());
  for (const RankId r : local) {
    for (const StageId s : schedule_.stages_of(r)) {
      const auto i = static_cast<std::size_t>(s.value());
      const nn::LayerRange range{boundaries_[i], boundaries_[i + 1]};
      stages_[i] = std::make_unique<nn::Stage>(config_, range,
                                               nn::StageOptions{options_.recompute_interval, fmt::format("stage {}", s)});
      optimizers_[i] = std::make_unique<nn::AdamW>(
          *stages_[i], options_.optimizer,
          nn::OptimizerShard::of(stages_[i]->layout().total(), sharded() ? options_.data_parallel : 1,
                                 sharded() ? options_.data_rank : 0));
    }
  }
  std::vector<nn::Stage*> stages;
  std::vector<nn::AdamW*> optimizers;
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    stages.push_back(stages_[i].get());
    optimizers.push_back(optimizers_[i].get());
  }
  for (auto& entry : progress_) entry.store(kInAnotherProcess);
  for (const RankId r : local) {
    workers_.push_back(std::make_unique<RankWorker>(schedule_, r, stages, optimizers, *transport_, options_,
                                                    progress_));
  }
  if (processes_ != nullptr && options_.data_parallel > 1) plan_early_reductions(local.front());
}

// A stage's gradients are complete after the rank's last B or W of it; one
// holding a side of the tied wte still needs the tied exchange of the flush.
void PipelineEngine::plan_early_reductions(RankId rank) {
  const std::vector<Action>& actions = schedule_.actions(rank);
  reduce_after_.assign(actions.size(), {});
  for (const StageId s : schedule_.stages_of(rank)) {
    if (stage(s).needs_tied_reduction()) continue;
    for (std::size_t i = actions.size(); i-- > 0;) {
      const Action& a = actions[i];
      if (a.stage == s && (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight)) {
        reduce_after_[i].push_back(s);
        break;
      }
    }
  }
}

PipelineEngine::~PipelineEngine() {
  threads_.reset();  // stops and joins the rank threads before what they used goes
  for (auto& worker : workers_) worker->release();
  transport_->reset();
}

bool PipelineEngine::is_reporter() const { return processes_ == nullptr || processes_->is_reporter(); }

nn::Stage& PipelineEngine::stage(StageId s) {
  return const_cast<nn::Stage&>(static_cast<const PipelineEngine*>(this)->stage(s));
}

const nn::Stage& PipelineEngine::stage(StageId s) const {
  const auto& held = stages_.at(static_cast<std::size_t>(s.value()));
  if (held == nullptr) fail("stage {} runs in another process (pipeline rank {})", s, schedule_.rank_of(s));
  return *held;
}

std::int64_t PipelineEngine::stage_parameter_count(StageId s) const {
  const auto i = static_cast<std::size_t>(s.value());
  return nn::ParameterLayout(config_, {boundaries_.at(i), boundaries_.at(i + 1)}).total();
}

void PipelineEngine::init_gpt2(std::uint64_t seed) {
  for (auto& stage : stages_) {
    if (stage) stage->init_gpt2(seed);
  }
}

void PipelineEngine::load_parameters(const nn::SafetensorsFile& file) {
  const nn::GptConfig stored = nn::read_config(file);
  if (!(stored == config_)) {
    fail("{}: holds a model with {} layers, {} heads, width {}, context {}, vocab {}; the run's model has {}, {}, {}, "
         "{}, {}",
         file.source(), stored.n_layer, stored.n_head, stored.n_embd, stored.context, stored.vocab_size,
         config_.n_layer, config_.n_head, config_.n_embd, config_.context, config_.vocab_size);
  }
  nn::check_values(file);
  for (auto& stage : stages_) {
    if (stage) nn::load_parameters(*stage, file);
  }
}

nn::SafetensorsWriter PipelineEngine::local_state(bool with_optimizer) const {
  nn::SafetensorsWriter writer;
  nn::write_config(writer, config_);
  // The stages that hold each tensor name, in stage order: a checkpoint keeps the first's copy (the embedding's wte).
  std::map<std::string, std::size_t, std::less<>> first_holder;
  std::vector<nn::ParameterLayout> layouts;
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    layouts.emplace_back(config_, nn::LayerRange{boundaries_[i], boundaries_[i + 1]});
    for (const nn::ParameterInfo& info : layouts.back().entries()) first_holder.emplace(info.name, i);
  }
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    if (!stages_[i]) continue;
    for (const nn::ParameterInfo& info : layouts[i].entries()) {
      if (first_holder.at(info.name) == i) writer.add(info.name, stages_[i]->parameter(info.name), info.shape);
    }
  }
  if (!with_optimizer) return writer;
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    if (!optimizers_[i]) continue;
    const nn::AdamW& optimizer = *optimizers_[i];
    const auto owned = [&, i](const nn::ParameterInfo& info) { return first_holder.at(info.name) == i; };
    if (!sharded()) {
      nn::AdamW::add_moments(writer, layouts[i], optimizer.exp_avg(), optimizer.exp_avg_sq(), optimizer.steps(),
                             owned);
      continue;
    }
    // ZeRO-1: every replica's moments of the stage, put together at data-parallel rank 0.
    const nn::OptimizerShard& shard = optimizer.shard();
    std::vector<float> m(static_cast<std::size_t>(layouts[i].total()));
    std::vector<float> v(m.size());
    std::copy(optimizer.exp_avg().begin(), optimizer.exp_avg().end(), m.begin() + shard.begin);
    std::copy(optimizer.exp_avg_sq().begin(), optimizer.exp_avg_sq().end(), v.begin() + shard.begin);
    const Deadline deadline = deadline_after(options_.timeout);
    MpiGroups::gather_parts(processes_->data(), m, deadline, "every replica's AdamW moments (ZeRO-1)");
    MpiGroups::gather_parts(processes_->data(), v, deadline, "every replica's AdamW moments (ZeRO-1)");
    nn::AdamW::add_moments(writer, layouts[i], m, v, optimizer.steps(), owned);
  }
  return writer;
}

std::optional<nn::SafetensorsFile> PipelineEngine::gathered_parameters() const {
  // Replica 0's ranks send their tensors to world rank 0 (pipeline rank 0 of replica 0).
  if (processes_->data_rank() != 0) return std::nullopt;
  const std::vector<std::string> parts =
      MpiGroups::gather_bytes(processes_->pipeline(), local_state(false).serialize(),
                              deadline_after(options_.timeout),
                              "every pipeline rank's tensors (for the whole model at rank 0)");
  if (!is_reporter()) return std::nullopt;
  std::vector<nn::SafetensorsFile> files;
  for (std::size_t r = 0; r < parts.size(); ++r) {
    files.push_back(nn::SafetensorsFile::parse(parts[r], fmt::format("pipeline rank {}'s tensors", r)));
  }
  return nn::SafetensorsFile::merge(files, "the gathered model");
}

void PipelineEngine::write_checkpoint(const std::filesystem::path& path, std::int64_t steps_done) const {
  if (update_failed_) fail("cannot write checkpoint {}: an optimizer update failed and the weights are inconsistent",
                           path.string());
  if (const auto bad = first_non_finite(Values::kParameters)) {
    fail("not writing checkpoint {}: {} is not finite; the run diverged (lower optimizer.params.lr)", path.string(),
         *bad);
  }
  if (processes_ == nullptr) {
    nn::SafetensorsWriter writer = local_state(true);
    writer.set_metadata("steps_done", std::to_string(steps_done));
    writer.write(path);
    return;
  }
  // Replica 0's ranks write a shard each (ZeRO-1: the other replicas send their moments first).
  const bool writes = processes_->data_rank() == 0;
  if (!writes && !sharded()) return;
  nn::SafetensorsWriter shard = local_state(true);
  if (!writes) return;
  shard.set_metadata("steps_done", std::to_string(steps_done));
  const int ranks = schedule_.num_ranks();
  const std::string file = nn::shard_file_name(processes_->pipeline_rank(), ranks);
  std::filesystem::create_directories(path);
  // An index left by an earlier write of this folder goes before any shard changes.
  std::filesystem::remove(path / nn::kSafetensorsIndex);
  shard.write(path / file);
  // Every shard is on disk before world rank 0 writes the index (the gather is the barrier).
  std::string listing = std::to_string(shard.data_bytes());
  for (const std::string& name : shard.names()) listing += "\n" + name;
  const std::vector<std::string> listings = MpiGroups::gather_bytes(
      processes_->pipeline(), listing, deadline_after(options_.timeout), "every pipeline rank's checkpoint shard");
  if (!is_reporter()) return;
  std::vector<nn::ShardContents> shards;
  std::set<std::string> files;
  for (std::size_t r = 0; r < listings.size(); ++r) {
    std::istringstream lines(listings[r]);  // its data bytes, then a tensor name a line
    nn::ShardContents contents{.file = nn::shard_file_name(static_cast<int>(r), ranks), .names = {}, .bytes = 0};
    std::string line;
    std::getline(lines, line);
    contents.bytes = std::stoull(line);
    while (std::getline(lines, line)) contents.names.push_back(line);
    files.insert(contents.file);
    shards.push_back(std::move(contents));
  }
  // Shards of an earlier write of this folder by another layout are not this checkpoint's.
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    const std::string name = entry.path().filename().string();
    if (nn::is_shard_file_name(name) && !files.contains(name)) std::filesystem::remove(entry.path());
  }
  nn::write_safetensors_index(path, shards);
}

std::int64_t PipelineEngine::load_checkpoint(const nn::SafetensorsFile& file) {
  const std::int64_t steps_done = file.metadata_count("steps_done");
  load_parameters(file);
  for (auto& optimizer : optimizers_) {
    if (optimizer) optimizer->load_state(file);
  }
  return steps_done;
}

const nn::Stage& PipelineEngine::holder(std::string_view name) const {
  for (const auto& stage : stages_) {
    if (stage && stage->layout().find(name) != nullptr) return *stage;
  }
  fail("the model has no tensor named {}{}", name, processes_ != nullptr ? " in this process's stages" : "");
}

std::optional<std::string> PipelineEngine::first_non_finite(Values values) const {
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    if (!stages_[s]) continue;
    const nn::Stage& stage = *stages_[s];
    const bool parameters = values == Values::kParameters;
    // Under ZeRO-1 a replica's summed gradient is its optimizer's part (the
    // rest is its own, unsummed); the parameters are whole.
    const nn::OptimizerShard part =
        parameters ? nn::OptimizerShard::of(stage.layout().total(), 1, 0) : optimizers_[s]->shard();
    if (const auto name =
            non_finite_tensor(stage.layout(), parameters ? stage.parameters() : stage.gradients(), part)) {
      return fmt::format("stage {}'s {} {}", s, parameters ? "parameter" : "gradient of", *name);
    }
  }
  return std::nullopt;
}

std::span<const float> PipelineEngine::parameter(std::string_view name) const { return holder(name).parameter(name); }
std::span<const float> PipelineEngine::gradient(std::string_view name) const { return holder(name).gradient(name); }

std::unique_ptr<nn::Stage> PipelineEngine::assemble_model(bool with_gradients) const {
  if (processes_ != nullptr) {
    if (with_gradients) fail("the gradients of a whole model are assembled in one process only");
    const std::optional<nn::SafetensorsFile> state = gathered_parameters();
    if (!state) return nullptr;
    auto model = std::make_unique<nn::Stage>(config_, nn::all_layers(config_), nn::StageOptions{0, "model"});
    nn::load_parameters(*model, *state);
    return model;
  }
  auto model = std::make_unique<nn::Stage>(config_, nn::all_layers(config_), nn::StageOptions{0, "model"});
  for (const nn::ParameterInfo& info : model->layout().entries()) {
    const nn::Stage& from = holder(info.name);
    std::copy(from.parameter(info.name).begin(), from.parameter(info.name).end(),
              model->parameter(info.name).begin());
    if (with_gradients) {
      std::copy(from.gradient(info.name).begin(), from.gradient(info.name).end(), model->gradient(info.name).begin());
    }
  }
  return model;
}

std::int64_t PipelineEngine::global_batch() const {
  return static_cast<std::int64_t>(schedule_.num_microbatches()) * options_.micro_batch * options_.data_parallel;
}

std::int64_t PipelineEngine::tokens_per_step() const {
  return global_batch() * options_.seq_length;
}

// The flush after the pipeline part, as the phases every rank runs in order.
// The tied exchange (within a replica) comes before the data-parallel
// reduction: after a reduce-scatter a replica holds only its part of a
// stage's gradient, and the two sides' parts of wte are not the same elements.
enum class PipelineEngine::FlushStep {
  kPostTiedGradients,
  kReduceTiedGradients,
  kReduceDataParallel,
  kGradientNorm,
  kUpdate
};
const PipelineEngine::FlushStep PipelineEngine::kFlushOrder[] = {
    FlushStep::kPostTiedGradients, FlushStep::kReduceTiedGradients, FlushStep::kReduceDataParallel,
    FlushStep::kGradientNorm, FlushStep::kUpdate};

// What the ranks' flushes share within one step (each rank writes only its
// own entries).
struct PipelineEngine::Flush {
  explicit Flush(std::size_t ranks) : tied_start(ranks), square_sum(ranks, 0.0), small_square_sum(ranks, 0.0) {}

  // Threaded, every rank holds the all-reduced sum; serial, each its own,
  // added here in rank order as the all-reduce adds them (0 + v0 + v1 + …),
  // so both modes get the same bits.
  static double total(const std::vector<double>& sums, std::size_t rank, RunMode run) {
    if (run == RunMode::kThreaded) return sums[rank];
    double sum = 0;
    for (const double v : sums) sum += v;
    return sum;
  }
  double grad_norm(std::size_t rank, RunMode run) const { return std::sqrt(total(square_sum, rank, run)); }

  std::vector<Clock::time_point> tied_start;
  std::vector<double> square_sum;
  std::vector<double> small_square_sum;  // RankWorker::small_square_sum, on a step measuring the noise scale
  std::atomic<bool> updating{false};  // an optimizer update has begun on some rank
};

StepResult PipelineEngine::step(std::int64_t step, const BatchSource& source, StepMode mode, RunMode run) {
  if (update_failed_) {
    fail("the pipeline failed during an optimizer update in step {}: its weights are no longer consistent; start "
         "the run again",
         current_step_);
  }
  current_step_ = step;
  transport_->reset();
  const Clock::time_point epoch = Clock::now();
  for (auto& worker : workers_) worker->begin_step(step, source, epoch);
  StepResult result;
  result.step = step;
  result.mode = run;
  result.tokens = tokens_per_step();
  result.lr = options_.lr_schedule.lr(step);
  if (processes_ != nullptr && run == RunMode::kSerial) fail("an emulated (serial) step runs in one process only");
  Flush flush(static_cast<std::size_t>(schedule_.num_ranks()));
  if (run == RunMode::kThreaded) {
    run_threaded(mode, result.lr, flush);
  } else {
    run_serial(mode, result.lr, flush);
  }
  result.wall_s = std::chrono::duration<double>(Clock::now() - epoch).count();
  const auto reporting_rank = static_cast<std::size_t>(workers_.front()->rank().value());
  result.grad_norm = flush.grad_norm(reporting_rank, run);
  if (workers_.front()->measures_noise_scale()) {
    // The accumulated gradient carries the loss scale 1/(m·d): undone, it is the micro-batch's mean-loss gradient.
    const double unscale = static_cast<double>(schedule_.num_microbatches()) * options_.data_parallel;
    result.grad_square_small = Flush::total(flush.small_square_sum, reporting_rank, run) * unscale * unscale;
  }
  result.skipped = mode == StepMode::kTrain && !std::isfinite(result.grad_norm);
  result.clip_coefficient = result.skipped ? 1 : clip_coefficient(mode, result.grad_norm);
  finish(result, epoch);
  return result;
}

double PipelineEngine::clip_coefficient(StepMode mode, double grad_norm) const {
  return mode == StepMode::kTrain ? nn::clip_coefficient(grad_norm, options_.gradient_clipping) : 1.0;
}

// One phase of rank w's flush, written once for both run modes. Threaded, a
// rank runs every phase on its own thread and waits for the other ranks'
// tied-gradient copy and the all-reduce; serial, every rank runs a phase
// before any runs the next, so nothing has to wait.
RankWorker::Outcome PipelineEngine::flush_step(FlushStep step, RankWorker& w, StepMode mode, RunMode run,
                                               double lr, Flush& flush) {
  const auto r = static_cast<std::size_t>(w.rank().value());
  switch (step) {
    case FlushStep::kReduceDataParallel:
      if (options_.data_parallel > 1) reduce_data_parallel(w);
      return RankWorker::Outcome::kDone;
    case FlushStep::kPostTiedGradients:
      flush.tied_start[r] = Clock::now();
      return w.post_tied_gradients();
    case FlushStep::kReduceTiedGradients: {
      const RankWorker::Outcome outcome = w.reduce_tied_gradients(run == RunMode::kThreaded);
      if (outcome == RankWorker::Outcome::kNotReady) fail("serial run: rank {}'s tied-gradient copy was not posted", r);
      if (outcome == RankWorker::Outcome::kDone) w.record_phase(FlushPhase::kTiedGradients, flush.tied_start[r]);
      return outcome;
    }
    case FlushStep::kGradientNorm: {
      const Clock::time_point start = Clock::now();
      double sum = w.gradient_square_sum() + loss_guard(w, schedule_.num_microbatches());
      if (options_.data_parallel > 1) {  // the replicas' parts, in replica order
        const std::vector<double> parts = MpiGroups::all_gather(processes_->data(), {&sum, 1},
                                                                deadline_after(options_.timeout),
                                                                "every replica's part of the gradient norm");
        sum = 0;
        for (const double part : parts) sum += part;
      }
      if (run == RunMode::kThreaded && w.all_reduce_sum(sum) == RankWorker::Outcome::kAborted) {
        return RankWorker::Outcome::kAborted;
      }
      double small = w.small_square_sum();
      if (w.measures_noise_scale() && run == RunMode::kThreaded &&
          w.all_reduce_sum(small) == RankWorker::Outcome::kAborted) {
        return RankWorker::Outcome::kAborted;
      }
      w.record_phase(FlushPhase::kGradientNorm, start);
      flush.square_sum[r] = sum;
      flush.small_square_sum[r] = small;
      return RankWorker::Outcome::kDone;
    }
    case FlushStep::kUpdate:
      // Every rank holds the same norm, so all skip a non-finite step together.
      if (mode == StepMode::kTrain && std::isfinite(flush.grad_norm(r, run))) {
        flush.updating.store(true);
        w.apply_update(clip_coefficient(mode, flush.grad_norm(r, run)), lr);
        if (sharded()) gather_parameters(w);
      }
      return RankWorker::Outcome::kDone;
  }
  return RankWorker::Outcome::kDone;
}

// Each rank on its own persistent thread (RankThreads, started at the first
// threaded step). A failing worker records its error and aborts the
// transport; the others return at their next action or wait; run() returns
// once every rank has, and the first error is rethrown.
void PipelineEngine::run_threaded(StepMode mode, double lr, Flush& flush) {
  std::mutex error_mutex;
  std::exception_ptr first_error;
  const auto job = [&](int index) {
    RankWorker& w = *workers_[static_cast<std::size_t>(index)];
    try {
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (w.run(i, true) == RankWorker::Outcome::kAborted) return;
        post_reductions_after(i);
      }
      for (const FlushStep step : kFlushOrder) {
        if (flush_step(step, w, mode, RunMode::kThreaded, lr, flush) == RankWorker::Outcome::kAborted) return;
      }
      w.complete_sends();
    } catch (...) {
      {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      transport_->abort();
    }
  };
  if (processes_ != nullptr) {
    job(0);  // one rank per process, on this thread: mpirun binds the process to its core
  } else {
    if (!threads_) threads_ = std::make_unique<RankThreads>(schedule_.num_ranks());
    threads_->run(job);
  }
  if (first_error && processes_ != nullptr) {
    // Peers in other processes cannot be told to stop a step half done, and
    // transfers of this one may still be under way: end the job from here.
    try {
      std::rethrow_exception(first_error);
    } catch (const std::exception& error) {
      MpiWorld::fail_job(error.what());
    }
  }
  if (first_error) {
    if (flush.updating.load()) update_failed_ = true;
    for (auto& worker : workers_) worker->release();
    std::rethrow_exception(first_error);
  }
}

// Every rank on this thread: passes over the ranks, each running as far as
// its messages allow, until all lists are done; then the flush phase by phase.
void PipelineEngine::run_serial(StepMode mode, double lr, Flush& flush) {
  try {
    std::vector<std::size_t> next(workers_.size(), 0);
    for (bool done = false; !done;) {
      done = true;
      bool moved = false;
      for (std::size_t r = 0; r < workers_.size(); ++r) {
        RankWorker& w = *workers_[r];
        while (next[r] < w.size() && w.run(next[r], false) == RankWorker::Outcome::kDone) {
          ++next[r];
          moved = true;
        }
        done = done && next[r] == w.size();
      }
      if (!done && !moved) fail("serial run of {} is stuck although the schedule validated", schedule_.name());
    }
    for (const FlushStep step : kFlushOrder) {
      for (auto& worker : workers_) flush_step(step, *worker, mode, RunMode::kSerial, lr, flush);
    }
  } catch (...) {
    if (flush.updating.load()) update_failed_ = true;
    for (auto& worker : workers_) worker->release();
    throw;
  }
}

void PipelineEngine::post_reductions_after(std::size_t index) {
  if (reduce_after_.empty()) return;
  for (Reduction& reduction : reductions_) reduction.parts->poll();
  for (const StageId s : reduce_after_[index]) post_reduction(s);
}

void PipelineEngine::post_reduction(StageId s) {
  reductions_.push_back(
      {s,
       std::make_unique<ReduceScatterParts>(processes_->data(), stage(s).gradients(),
                                            fmt::format("the data-parallel reduce-scatter of stage {}'s gradients", s),
                                            static_cast<std::size_t>(options_.reduce_bucket_size)),
       Clock::now()});
}

// Every stage's reduce-scatter (the rest posted now), in the order posted,
// then the all-gather of its summed gradients; under ZeRO-1 each replica
// keeps its part and the weights are gathered after the update instead.
// Each stage is recorded from its posting or the end of the stage before,
// so that the phases do not overlap.
void PipelineEngine::reduce_data_parallel(RankWorker& w) {
  for (const StageId s : schedule_.stages_of(w.rank())) {
    const bool posted = std::any_of(reductions_.begin(), reductions_.end(),
                                    [&](const Reduction& reduction) { return reduction.stage == s; });
    if (!posted) post_reduction(s);
  }
  Clock::time_point previous_end = Clock::time_point::min();
  for (Reduction& reduction : reductions_) {
    reduction.parts->finish(deadline_after(options_.timeout));
    if (!sharded()) {
      MpiGroups::all_gather_parts(processes_->data(), stage(reduction.stage).gradients(),
                                  deadline_after(options_.timeout),
                                  fmt::format("every replica's summed part of stage {}'s gradients", reduction.stage));
    }
    w.record_phase(FlushPhase::kDataParallelGradients, reduction.stage, std::max(reduction.posted, previous_end));
    previous_end = Clock::now();
  }
  reductions_.clear();
}

std::int64_t PipelineEngine::optimizer_state_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& optimizer : optimizers_) {
    if (optimizer) bytes += 2 * static_cast<std::int64_t>(sizeof(float)) * optimizer->shard().size();
  }
  return bytes;
}

std::int64_t PipelineEngine::local_parameter_count() const {
  std::int64_t count = 0;
  for (const auto& stage : stages_) {
    if (stage) count += stage->layout().total();
  }
  return count;
}

bool PipelineEngine::sharded() const { return options_.shard_optimizer && options_.data_parallel > 1; }

// ZeRO-1: each replica updated its shard of the rank's stages; every
// replica gets the others'.
void PipelineEngine::gather_parameters(RankWorker& w) {
  for (const StageId s : schedule_.stages_of(w.rank())) {
    const Clock::time_point start = Clock::now();
    MpiGroups::all_gather_parts(processes_->data(), stage(s).parameters(), deadline_after(options_.timeout),
                                fmt::format("every replica's updated shard of stage {} (ZeRO-1)", s));
    w.record_phase(FlushPhase::kDataParallelWeights, s, start);
  }
}

void PipelineEngine::finish(StepResult& result, Clock::time_point epoch) {
  const int m = schedule_.num_microbatches();
  if (processes_ != nullptr) {
    gather_results(result, epoch);
    return;
  }
  for (const auto& worker : workers_) {
    if (!worker->holds_last_stage()) continue;
    double sum = 0;
    for (int j = 0; j < m; ++j) {
      result.microbatch_losses.push_back(worker->microbatch_loss(j));
      sum += worker->microbatch_loss(j);
    }
    result.loss = sum / m;
  }
  for (const auto& worker : workers_) result.ranks.push_back(worker->record());
}

namespace {

// A RankRecord as doubles, to gather at world rank 0: the epoch (seconds of
// rank 0's steady clock), the peak, the counts, then 8 numbers per action and
// 4 per phase.
std::string record_bytes(const RankRecord& record, double epoch_s) {
  std::vector<double> v{epoch_s, static_cast<double>(record.peak_activation_bytes),
                        static_cast<double>(record.actions.size()), static_cast<double>(record.phases.size())};
  for (const ActionTiming& t : record.actions) {
    v.insert(v.end(), {static_cast<double>(t.action.stage.value()), static_cast<double>(t.action.kind),
                       static_cast<double>(t.action.microbatch.value()), t.start_s, t.end_s, t.wait_s,
                       static_cast<double>(t.held_bytes), static_cast<double>(t.working_bytes)});
  }
  for (const PhaseTiming& p : record.phases) {
    v.insert(v.end(), {static_cast<double>(p.phase), static_cast<double>(p.stage.value()), p.start_s, p.end_s});
  }
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double)};
}

// The record of record_bytes, its times moved by `shift` seconds.
RankRecord parse_record(const std::string& bytes, double shift) {
  std::vector<double> v(bytes.size() / sizeof(double));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(double));
  RankRecord record;
  record.peak_activation_bytes = static_cast<std::int64_t>(v.at(1));
  const auto actions = static_cast<std::size_t>(v.at(2));
  const auto phases = static_cast<std::size_t>(v.at(3));
  std::size_t i = 4;
  for (std::size_t a = 0; a < actions; ++a, i += 8) {
    const Action action{StageId(static_cast<int>(v.at(i))), static_cast<ActionKind>(static_cast<int>(v.at(i + 1))),
                        MicrobatchId(static_cast<int>(v.at(i + 2)))};
    record.actions.push_back({.action = action,
                              .start_s = v.at(i + 3) + shift,
                              .end_s = v.at(i + 4) + shift,
                              .wait_s = v.at(i + 5),
                              .held_bytes = static_cast<std::int64_t>(v.at(i + 6)),
                              .working_bytes = static_cast<std::int64_t>(v.at(i + 7))});
  }
  for (std::size_t p = 0; p < phases; ++p, i += 4) {
    record.phases.push_back({.phase = static_cast<FlushPhase>(static_cast<int>(v.at(i))),
                             .stage = StageId(static_cast<int>(v.at(i + 1))),
                             .start_s = v.at(i + 2) + shift,
                             .end_s = v.at(i + 3) + shift});
  }
  return record;
}

}  // namespace

// Every process gets the losses (from the last pipeline rank of every
// replica, in replica order); world rank 0 gets its replica's records, each
// moved onto rank 0's epoch.
void PipelineEngine::gather_results(StepResult& result, Clock::time_point epoch) const {
  const int m = schedule_.num_microbatches();
  const RankWorker& w = *workers_.front();
  std::vector<double> mine{w.holds_last_stage() ? 1.0 : 0.0};
  for (int j = 0; j < m; ++j) mine.push_back(w.holds_last_stage() ? w.microbatch_loss(j) : 0.0);
  const std::vector<double> all = MpiGroups::all_gather(processes_->world(), mine, deadline_after(options_.timeout),
                                                        "the micro-batch losses of every replica");
  double sum = 0;
  for (std::size_t at = 0; at < all.size(); at += mine.size()) {
    if (all[at] != 1.0) continue;
    for (int j = 1; j <= m; ++j) {
      result.microbatch_losses.push_back(all[at + static_cast<std::size_t>(j)]);
      sum += all[at + static_cast<std::size_t>(j)];
    }
  }
  result.loss = sum / static_cast<double>(result.microbatch_losses.size());
  if (processes_->data_rank() != 0) {
    result.ranks.push_back(w.record());
    return;
  }
  const double epoch_s =
      std::chrono::duration<double>(epoch.time_since_epoch()).count() - processes_->clock_offset_s();
  const std::vector<std::string> parts = MpiGroups::gather_bytes(
      processes_->pipeline(), record_bytes(w.record(), epoch_s), deadline_after(options_.timeout),
      "every pipeline rank's timings of the step");
  for (const std::string& part : parts) {
    double their_epoch_s = 0;
    std::memcpy(&their_epoch_s, part.data(), sizeof their_epoch_s);
    result.ranks.push_back(parse_record(part, their_epoch_s - epoch_s));
  }
  if (result.ranks.empty()) result.ranks.push_back(w.record());
}

}  // namespace pipeflow::runtime
