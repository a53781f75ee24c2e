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
#include "pipeflow/schedule/validate.h"
#include "engine/rank_worker.h"
#include "engine/tensor_collectives.h"

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

void check_boundaries(int layers, const Schedule& schedule, const std::vector<int>& b) {
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
template <class StageT>
double loss_guard(const BasicRankWorker<StageT>& w, int microbatches) {
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

// What one data-parallel replica keeps in this process: the stages of its
// ranks here (nullptr: another process's), their optimizers, the transport
// between its pipeline ranks and how far each rank has got.
template <class StageT>
struct BasicPipelineEngine<StageT>::Replica {
  Replica(int data_rank, EngineOptions engine_options, std::size_t num_stages, std::size_t num_ranks)
      : options(std::move(engine_options)), stages(num_stages), optimizers(num_stages), progress(num_ranks) {
    options.data_rank = data_rank;
    for (auto& entry : progress) entry.store(kInAnotherProcess);
  }
  EngineOptions options;  // with this replica's data_rank
  std::vector<std::unique_ptr<StageT>> stages;       // by stage
  std::vector<std::unique_ptr<nn::AdamW>> optimizers;  // by stage
  std::unique_ptr<Transport> transport;
  Progress progress;
};

// One rank this process runs: its worker, its replica (the pipeline of its
// data-parallel and tensor-parallel ranks), its sub-groups, and
// (with d > 1) its data-parallel reductions: by action index, the stages
// whose reduce-scatter may be posted after it; those of this step under
// way, in the order they were posted (the same on every replica, as a
// group's collectives must be).
template <class StageT>
struct BasicPipelineEngine<StageT>::LocalRank {
  int world_rank = 0;
  RankId rank;  // pipeline rank
  int data_rank = 0;
  int tensor_rank = 0;
  Replica* replica = nullptr;
  Communicator* pipeline = nullptr;
  Communicator* data = nullptr;
  Communicator* tensor = nullptr;
  Communicator* world = nullptr;
  // The layers' tensor-parallel collectives (tensor parallelism > 1).
  std::unique_ptr<TensorCollectives> tensor_collectives;
  std::unique_ptr<BasicRankWorker<StageT>> worker;
  std::vector<std::vector<StageId>> reduce_after;
  struct Reduction {
    StageId stage;
    std::unique_ptr<PartsReduction> parts;
    Clock::time_point posted;
  };
  std::vector<Reduction> reductions;
};

template <class StageT>
BasicPipelineEngine<StageT>::BasicPipelineEngine(const Config& config, const Schedule& schedule,
                                                 std::vector<int> boundaries, EngineOptions options)
    : BasicPipelineEngine(config, schedule, std::move(boundaries), options, nullptr,
                          RankGroup::in_threads({.pipeline = schedule.num_ranks(),
                                                 .data_parallel = options.data_parallel,
                                                 .tensor = options.tensor_parallel})) {}

template <class StageT>
BasicPipelineEngine<StageT>::BasicPipelineEngine(const Config& config, const Schedule& schedule,
                                                 std::vector<int> boundaries, EngineOptions options,
                                                 RankGroup& group)
    : BasicPipelineEngine(config, schedule, std::move(boundaries), std::move(options), &group, nullptr) {}

template <class StageT>
BasicPipelineEngine<StageT>::BasicPipelineEngine(const Config& config, const Schedule& schedule,
                                                 std::vector<int> boundaries, EngineOptions options,
                                                 RankGroup* group, std::unique_ptr<RankGroup> own_group)
    : config_(config),
      schedule_(lowered_and_valid(schedule)),
      boundaries_(std::move(boundaries)),
      options_(std::move(options)),
      own_group_(std::move(own_group)),
      group_(group != nullptr ? group : own_group_.get()) {
  Traits::validate(config_, options_, group_->layout().tensor);
  check_boundaries(Traits::pipeline_layers(config_), schedule_, boundaries_);
  if (options_.micro_batch < 1) fail("train_micro_batch_size_per_gpu = {}: must be >= 1", options_.micro_batch);
  if (options_.timeout.count() <= 0) fail("timeout = {} s: must be > 0", options_.timeout.count());
  if (options_.loss_scale) scaler_.emplace(*options_.loss_scale);
  const RankLayout& layout = group_->layout();
  if (layout.pipeline != schedule_.num_ranks()) {
    fail("the ranks form pipelines of {} ranks and schedule {} has {}", layout.pipeline, schedule_.name(),
         schedule_.num_ranks());
  }
  options_.data_parallel = layout.data_parallel;
  options_.tensor_parallel = layout.tensor;
  options_.data_rank = 0;
  const auto num_stages = static_cast<std::size_t>(schedule_.num_stages());
  const auto num_ranks = static_cast<std::size_t>(schedule_.num_ranks());
  const PipelineTraffic traffic{.inbox_capacity = inbox_capacities(schedule_),
                                .stages = schedule_.num_stages(),
                                .microbatches = schedule_.num_microbatches(),
                                .wire = options_.format};
  // One pipeline per (data-parallel rank, tensor-parallel rank).
  std::vector<Replica*> by_pipeline(static_cast<std::size_t>(layout.data_parallel * layout.tensor), nullptr);
  for (const int w : group_->local_ranks()) {
    const int d = layout.data_rank(w);
    const int t = layout.tensor_rank(w);
    Replica*& replica = by_pipeline[static_cast<std::size_t>(d * layout.tensor + t)];
    if (replica == nullptr) {
      replicas_.push_back(std::make_unique<Replica>(d, options_, num_stages, num_ranks));
      replica = replicas_.back().get();
      replica->transport = group_->pipeline_transport(d, t, traffic);
    }
    auto r = std::make_unique<LocalRank>();
    r->world_rank = w;
    r->rank = RankId(layout.pipeline_rank(w));
    r->data_rank = d;
    r->tensor_rank = t;
    r->replica = replica;
    r->pipeline = &group_->pipeline(w);
    r->data = &group_->data(w);
    r->tensor = &group_->tensor(w);
    r->world = &group_->world(w);
    if (layout.tensor > 1) r->tensor_collectives = std::make_unique<TensorCollectives>(*r->tensor, options_.timeout);
    for (const StageId s : schedule_.stages_of(r->rank)) {
      const auto i = static_cast<std::size_t>(s.value());
      const nn::LayerRange range{boundaries_[i], boundaries_[i + 1]};
      replica->stages[i] = Traits::make_stage(config_, range, options_,
                                              layout.tensor > 1
                                                  ? fmt::format("stage {} (tensor-parallel rank {})", s, t)
                                                  : fmt::format("stage {}", s),
                                              r->tensor_collectives.get());
      replica->optimizers[i] = std::make_unique<nn::AdamW>(
          *replica->stages[i], options_.optimizer,
          nn::OptimizerShard::of(replica->stages[i]->layout().total(), sharded() ? layout.data_parallel : 1,
                                 sharded() ? d : 0));
    }
    ranks_.push_back(std::move(r));
  }
  for (auto& r : ranks_) {
    Replica& replica = *r->replica;
    std::vector<StageT*> stages;
    std::vector<nn::AdamW*> optimizers;
    for (std::size_t i = 0; i < num_stages; ++i) {
      stages.push_back(replica.stages[i].get());
      optimizers.push_back(replica.optimizers[i].get());
    }
    r->worker = std::make_unique<BasicRankWorker<StageT>>(schedule_, r->rank, stages, optimizers,
                                                          Traits::embedding_stage(config_, boundaries_),
                                                          *replica.transport, replica.options, replica.progress);
    // Under sequence parallelism a stage's gradients are complete only after
    // the flush's sum over its tensor-parallel ranks: nothing is posted early.
    if (options_.data_parallel > 1 && !sequence_parallel()) plan_early_reductions(*r);
  }
}

// A stage's gradients are complete after the rank's last B or W of it; one
// holding a side of the tied wte still needs the tied exchange of the flush.
template <class StageT>
void BasicPipelineEngine<StageT>::plan_early_reductions(LocalRank& r) {
  const std::vector<Action>& actions = schedule_.actions(r.rank);
  r.reduce_after.assign(actions.size(), {});
  for (const StageId s : schedule_.stages_of(r.rank)) {
    if (r.replica->stages[static_cast<std::size_t>(s.value())]->needs_tied_reduction()) continue;
    for (std::size_t i = actions.size(); i-- > 0;) {
      const Action& a = actions[i];
      if (a.stage == s && (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight)) {
        r.reduce_after[i].push_back(s);
        break;
      }
    }
  }
}

template <class StageT>
BasicPipelineEngine<StageT>::~BasicPipelineEngine() {
  for (auto& r : ranks_) r->worker->release();
  for (auto& replica : replicas_) replica->transport->reset();
  ranks_.clear();
}

template <class StageT>
std::size_t BasicPipelineEngine<StageT>::local_index(int world_rank) const {
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i]->world_rank == world_rank) return i;
  }
  fail("world rank {} runs in another process", world_rank);
}

template <class StageT>
typename BasicPipelineEngine<StageT>::LocalRank& BasicPipelineEngine<StageT>::local(int world_rank) const {
  return *ranks_[local_index(world_rank)];
}

template <class StageT>
bool BasicPipelineEngine<StageT>::is_reporter() const { return group_->is_reporter(); }

template <class StageT>
StageT& BasicPipelineEngine<StageT>::stage(StageId s) {
  return const_cast<StageT&>(static_cast<const BasicPipelineEngine*>(this)->stage(s));
}

template <class StageT>
const StageT& BasicPipelineEngine<StageT>::stage(StageId s) const {
  const auto& held = first_replica().stages.at(static_cast<std::size_t>(s.value()));
  if (held == nullptr) fail("stage {} runs in another process (pipeline rank {})", s, schedule_.rank_of(s));
  return *held;
}

template <class StageT>
std::int64_t BasicPipelineEngine<StageT>::stage_parameter_count(StageId s) const {
  const auto i = static_cast<std::size_t>(s.value());
  return Traits::parameter_count(config_, {boundaries_.at(i), boundaries_.at(i + 1)}, options_.tensor_parallel);
}

template <class StageT>
void BasicPipelineEngine<StageT>::init_parameters(std::uint64_t seed) {
  for (auto& replica : replicas_) {
    for (auto& stage : replica->stages) {
      if (stage) stage->init_parameters(seed);
    }
  }
}

template <class StageT>
void BasicPipelineEngine<StageT>::load_parameters(const nn::SafetensorsFile& file) {
  Traits::check_file(file, config_);
  for (auto& replica : replicas_) {
    for (auto& stage : replica->stages) {
      if (stage) Traits::load(*stage, file);
    }
  }
}

// A rank's tensors, whole: a split tensor's parts are gathered at
// tensor-parallel rank 0, which alone returns a writer that holds anything
// (ZeRO-1: the moments are first gathered at data-parallel rank 0).
template <class StageT>
nn::SafetensorsWriter BasicPipelineEngine<StageT>::rank_state(LocalRank& r, bool with_optimizer,
                                                             bool with_gradients) const {
  nn::SafetensorsWriter writer;
  Traits::write_config(writer, config_);
  // The stage that holds each tensor name first: the model keeps its copy (the embedding's wte).
  std::map<std::string, std::size_t, std::less<>> first_holder;
  for (std::size_t i = 0; i < boundaries_.size() - 1; ++i) {
    const nn::ParameterLayout layout = Traits::range_layout(config_, {boundaries_[i], boundaries_[i + 1]});
    for (const nn::ParameterInfo& info : layout.entries()) first_holder.emplace(info.name, i);
  }
  // Whether stage i writes a tensor: those of no range's layout (LoRA's adapters) have one holder.
  const auto writes = [&](std::size_t i, const std::string& name) {
    const auto holder = first_holder.find(name);
    return holder == first_holder.end() || holder->second == i;
  };
  const Deadline deadline = deadline_after(options_.timeout);
  const auto add = [&](std::string name, const nn::ParameterInfo& info, std::span<const float> part) {
    if (!info.split()) {
      if (r.tensor_rank == 0) writer.add(std::move(name), part, info.whole);
      return;
    }
    const std::vector<std::string> parts = r.tensor->gather_bytes(
        std::string(reinterpret_cast<const char*>(part.data()), part.size_bytes()), deadline,
        fmt::format("every tensor-parallel rank's part of {}", name));
    if (r.tensor_rank != 0) return;
    std::vector<float> whole(static_cast<std::size_t>(info.whole.numel()));
    std::vector<float> theirs(part.size());
    nn::ParameterInfo holder = info;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      std::memcpy(theirs.data(), parts[k].data(), std::min(parts[k].size(), theirs.size() * sizeof(float)));
      holder.slice.rank = static_cast<int>(k);
      nn::place_part<float>(holder, theirs, whole);
    }
    writer.add(std::move(name), whole, info.whole);
  };
  const auto of = [](std::span<const float> values, const nn::ParameterInfo& info) {
    return values.subspan(static_cast<std::size_t>(info.offset), static_cast<std::size_t>(info.numel()));
  };
  const std::vector<StageId> mine = schedule_.stages_of(r.rank);
  for (const StageId s : mine) {
    const auto i = static_cast<std::size_t>(s.value());
    const StageT& stage = *r.replica->stages[i];
    for (const nn::ParameterLayout* layout : Traits::saved_layouts(stage)) {
      for (const nn::ParameterInfo& info : layout->entries()) {
        if (!writes(i, info.name)) continue;
        add(info.name, info, stage.parameter(info.name));
        if (with_gradients && layout == &stage.layout()) add("grad." + info.name, info, stage.gradient(info.name));
      }
    }
  }
  if (!with_optimizer) return writer;
  for (const StageId s : mine) {
    const auto i = static_cast<std::size_t>(s.value());
    const StageT& stage = *r.replica->stages[i];
    const nn::AdamW& optimizer = *r.replica->optimizers[i];
    std::span<const float> m = optimizer.exp_avg();
    std::span<const float> v = optimizer.exp_avg_sq();
    std::vector<float> all_m, all_v;
    if (sharded()) {  // ZeRO-1: every replica's moments of the stage, put together at data-parallel rank 0
      const nn::OptimizerShard& shard = optimizer.shard();
      all_m.resize(static_cast<std::size_t>(stage.layout().total()));
      all_v.resize(all_m.size());
      std::copy(m.begin(), m.end(), all_m.begin() + shard.begin);
      std::copy(v.begin(), v.end(), all_v.begin() + shard.begin);
      r.data->gather_parts(all_m, deadline, "every replica's AdamW moments (ZeRO-1)");
      r.data->gather_parts(all_v, deadline, "every replica's AdamW moments (ZeRO-1)");
      if (r.data_rank != 0) continue;
      m = all_m;
      v = all_v;
    }
    for (const nn::ParameterInfo& info : stage.layout().entries()) {
      if (!writes(i, info.name)) continue;
      add("exp_avg." + info.name, info, of(m, info));
      add("exp_avg_sq." + info.name, info, of(v, info));
    }
    writer.set_metadata("adamw_step", std::to_string(optimizer.steps()));
  }
  return writer;
}

template <class StageT>
std::vector<nn::SafetensorsFile> BasicPipelineEngine<StageT>::gather_at_world_rank_0(
    LocalRank& r, const nn::SafetensorsWriter& part, std::string_view what) const {
  const std::vector<std::string> parts =
      r.pipeline->gather_bytes(part.serialize(), deadline_after(options_.timeout), what);
  std::vector<nn::SafetensorsFile> files;
  if (r.world_rank != 0) return files;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    files.push_back(nn::SafetensorsFile::parse(parts[k], fmt::format("pipeline rank {}'s part of {}", k, what)));
  }
  return files;
}

template <class StageT>
void BasicPipelineEngine<StageT>::write_checkpoint(const std::filesystem::path& path, std::int64_t steps_done,
                                      std::string_view run_id) const {
  if (update_failed_) fail("cannot write checkpoint {}: an optimizer update failed and the weights are inconsistent",
                           path.string());
  if (const auto bad = first_non_finite(Values::kParameters)) {
    fail("not writing checkpoint {}: {} is not finite; the run diverged (lower optimizer.params.lr)", path.string(),
         *bad);
  }
  group_->run([&](int w) { write_checkpoint_rank(local(w), path, steps_done, run_id); },
              [this] { abort_transports(); });
}

// Replica 0's ranks write the checkpoint (ZeRO-1: the other replicas send
// their moments first): one file through world rank 0, or a shard each.
template <class StageT>
void BasicPipelineEngine<StageT>::write_checkpoint_rank(LocalRank& r, const std::filesystem::path& path,
                                           std::int64_t steps_done, std::string_view run_id) const {
  nn::SafetensorsWriter shard = rank_state(r, true);
  if (r.data_rank != 0 || r.tensor_rank != 0) return;
  shard.set_metadata("steps_done", std::to_string(steps_done));
  if (!run_id.empty()) shard.set_metadata("run_id", std::string(run_id));
  shard.set_metadata("precision", to_string(options_.format));
  if (scaler_) {
    const LossScaler::State& state = scaler_->state();
    shard.set_metadata("loss_scale.scale", fmt::format("{}", state.scale));
    shard.set_metadata("loss_scale.hysteresis_left", std::to_string(state.hysteresis_left));
    shard.set_metadata("loss_scale.last_overflow", std::to_string(state.last_overflow));
    shard.set_metadata("loss_scale.iteration", std::to_string(state.iteration));
  }
  const Deadline deadline = deadline_after(options_.timeout);
  if (!group_->spans_processes()) {
    const std::vector<nn::SafetensorsFile> parts = gather_at_world_rank_0(r, shard, "the checkpoint");
    if (r.world_rank == 0) nn::SafetensorsFile::merged(parts).write(path);
    return;
  }
  const int ranks = schedule_.num_ranks();
  const std::string file = nn::shard_file_name(r.rank.value(), ranks);
  std::filesystem::create_directories(path);
  // An index left by an earlier write of this folder goes before any shard changes.
  std::filesystem::remove(path / nn::kSafetensorsIndex);
  shard.write(path / file);
  // Every shard is on disk before world rank 0 writes the index (the gather is the barrier).
  std::string listing = std::to_string(shard.data_bytes());
  for (const std::string& name : shard.names()) listing += "\n" + name;
  const std::vector<std::string> listings =
      r.pipeline->gather_bytes(listing, deadline, "every pipeline rank's checkpoint shard");
  if (r.world_rank != 0) return;
  std::vector<nn::ShardContents> shards;
  std::set<std::string> files;
  for (std::size_t k = 0; k < listings.size(); ++k) {
    std::istringstream lines(listings[k]);  // its data bytes, then a tensor name a line
    nn::ShardContents contents{.file = nn::shard_file_name(static_cast<int>(k), ranks), .names = {}, .bytes = 0};
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

template <class StageT>
std::int64_t BasicPipelineEngine<StageT>::load_checkpoint(const nn::SafetensorsFile& file) {
  const std::int64_t steps_done = file.metadata_count("steps_done");
  load_parameters(file);
  if (scaler_ && scaler_->dynamic() && file.metadata().contains("loss_scale.scale")) {
    const auto number = [&](const char* key) { return file.metadata_number(key); };
    const LossScaler::State state{.scale = number("loss_scale.scale"),
                                  .hysteresis_left = static_cast<int>(number("loss_scale.hysteresis_left")),
                                  .last_overflow = static_cast<std::int64_t>(number("loss_scale.last_overflow")),
                                  .iteration = file.metadata_count("loss_scale.iteration")};
    if (!(state.scale > 0)) fail("{}: __metadata__ loss_scale.scale = {}: must be > 0", file.source(), state.scale);
    scaler_->restore(state);
  }
  for (auto& replica : replicas_) {
    for (auto& optimizer : replica->optimizers) {
      if (optimizer) optimizer->load_state(file);
    }
  }
  return steps_done;
}

template <class StageT>
const StageT& BasicPipelineEngine<StageT>::holder(std::string_view name) const {
  for (const auto& stage : first_replica().stages) {
    if (stage && stage->layout().find(name) != nullptr) return *stage;
  }
  fail("the model has no tensor named {}{}", name,
       group_->local_ranks().size() < static_cast<std::size_t>(group_->layout().world_size())
           ? " in this process's stages"
           : "");
}

// Every pipeline this process holds: with tensor parallelism each holds its
// own parts of the split tensors.
template <class StageT>
std::optional<std::string> BasicPipelineEngine<StageT>::first_non_finite(Values values) const {
  for (const auto& replica : replicas_) {
    for (std::size_t s = 0; s < replica->stages.size(); ++s) {
      if (!replica->stages[s]) continue;
      const StageT& stage = *replica->stages[s];
      const bool parameters = values == Values::kParameters;
      // Under ZeRO-1 a replica's summed gradient is its optimizer's part (the
      // rest is its own, unsummed); the parameters are whole.
      const nn::OptimizerShard part =
          parameters ? nn::OptimizerShard::of(stage.layout().total(), 1, 0) : replica->optimizers[s]->shard();
      if (const auto name =
              non_finite_tensor(stage.layout(), parameters ? stage.parameters() : stage.gradients(), part)) {
        return fmt::format("stage {}'s {} {}", s, parameters ? "parameter" : "gradient of", *name);
      }
    }
  }
  return std::nullopt;
}

template <class StageT>
std::span<const float> BasicPipelineEngine<StageT>::parameter(std::string_view name) const {
  return holder(name).parameter(name);
}

template <class StageT>
std::span<const float> BasicPipelineEngine<StageT>::gradient(std::string_view name) const {
  return holder(name).gradient(name);
}

template <class StageT>
std::unique_ptr<StageT> BasicPipelineEngine<StageT>::assemble_model(bool with_gradients) const {
  // Replica 0's ranks send their tensors to world rank 0 (pipeline rank 0 of replica 0).
  std::optional<nn::SafetensorsFile> state;
  group_->run(
      [&](int w) {
        LocalRank& r = local(w);
        if (r.data_rank != 0) return;
        const nn::SafetensorsWriter mine = rank_state(r, false, with_gradients);
        if (r.tensor_rank != 0) return;
        const std::vector<nn::SafetensorsFile> parts = gather_at_world_rank_0(r, mine, "the whole model");
        if (r.world_rank == 0) state = nn::SafetensorsFile::merge(parts, "the gathered model");
      },
      [this] { abort_transports(); });
  if (!state) return nullptr;
  std::unique_ptr<StageT> model = Traits::whole_model(config_);
  Traits::load(*model, *state);
  if (with_gradients) {
    for (const nn::ParameterInfo& info : model->layout().entries()) {
      state->read_floats("grad." + info.name, info.shape, model->gradient(info.name));
    }
  }
  return model;
}

template <class StageT>
void BasicPipelineEngine<StageT>::abort_transports() const {
  for (const auto& replica : replicas_) replica->transport->abort();
}

template <class StageT>
std::int64_t BasicPipelineEngine<StageT>::global_batch() const {
  return static_cast<std::int64_t>(schedule_.num_microbatches()) * options_.micro_batch * options_.data_parallel;
}

template <class StageT>
std::int64_t BasicPipelineEngine<StageT>::tokens_per_step() const {
  return global_batch() * options_.seq_length;
}

// What the ranks' flushes share within one step (each rank writes only its
// own entries).
template <class StageT>
struct BasicPipelineEngine<StageT>::Flush {
  Flush(std::size_t ranks, double scale)
      : tied_start(ranks), square_sum(ranks, 0.0), small_square_sum(ranks, 0.0), loss_scale(scale) {}

  // Threaded, every rank holds the all-reduced sum; serial, each its own,
  // added here in rank order as the all-reduce adds them (0 + v0 + v1 + …),
  // so both modes get the same bits.
  static double total(const std::vector<double>& sums, std::size_t rank, RunMode run) {
    if (run == RunMode::kThreaded) return sums[rank];
    double sum = 0;
    for (const double v : sums) sum += v;
    return sum;
  }
  // The norm of the gradients with the loss scale divided out.
  double grad_norm(std::size_t rank, RunMode run) const {
    return std::sqrt(total(square_sum, rank, run)) / loss_scale;
  }

  std::vector<Clock::time_point> tied_start;
  std::vector<double> square_sum;
  std::vector<double> small_square_sum;  // RankWorker::small_square_sum, on a step measuring the noise scale
  std::atomic<bool> updating{false};  // an optimizer update has begun on some rank
  double loss_scale = 1;              // the step's (fp16), which the gradients carry
};

template <class StageT>
StepResult BasicPipelineEngine<StageT>::step(std::int64_t step, const Source& source, StepMode mode, RunMode run) {
  if (update_failed_) {
    fail("the pipeline failed during an optimizer update in step {}: its weights are no longer consistent; start "
         "the run again",
         current_step_);
  }
  if (run == RunMode::kSerial &&
      (ranks_.size() != static_cast<std::size_t>(group_->layout().world_size()) || options_.data_parallel > 1 ||
       options_.tensor_parallel > 1)) {
    fail("an emulated (serial) step runs one pipeline with every rank in this process (data_parallel 1, "
         "tensor_parallel 1, no mpirun)");
  }
  current_step_ = step;
  for (auto& replica : replicas_) replica->transport->reset();
  const Clock::time_point epoch = Clock::now();
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  for (auto& r : ranks_) r->worker->begin_step(step, source, epoch, loss_scale);
  StepResult result;
  result.step = step;
  result.loss_scale = loss_scale;
  result.mode = run;
  result.tokens = tokens_per_step();
  result.lr = options_.lr_schedule.lr(step);
  Flush flush(ranks_.size(), loss_scale);
  try {
    if (run == RunMode::kThreaded) {
      run_threaded(mode, result.lr, flush, result, epoch);
    } else {
      run_serial(mode, result.lr, flush);
      result.wall_s = std::chrono::duration<double>(Clock::now() - epoch).count();
    }
  } catch (...) {
    if (flush.updating.load()) update_failed_ = true;
    for (auto& r : ranks_) r->worker->release();
    throw;
  }
  result.grad_norm = flush.grad_norm(0, run);
  if (ranks_.front()->worker->measures_noise_scale()) {
    // The accumulated gradient carries the loss scale S/(m·d): undone, it is the micro-batch's mean-loss gradient.
    const double unscale = static_cast<double>(schedule_.num_microbatches()) * options_.data_parallel / loss_scale;
    result.grad_square_small = Flush::total(flush.small_square_sum, 0, run) * unscale * unscale;
  }
  result.skipped = mode == StepMode::kTrain && !std::isfinite(result.grad_norm);
  if (scaler_ && mode == StepMode::kTrain) {
    result.overflow = result.skipped && scaler_->can_lower();
    scaler_->update(result.skipped);
  }
  result.next_loss_scale = scaler_ ? scaler_->scale() : 1.0;
  result.clip_coefficient = result.skipped ? 1 : clip_coefficient(mode, result.grad_norm);
  if (run == RunMode::kSerial) finish_serial(result);
  return result;
}

template <class StageT>
double BasicPipelineEngine<StageT>::clip_coefficient(StepMode mode, double grad_norm) const {
  return mode == StepMode::kTrain ? nn::clip_coefficient(grad_norm, options_.gradient_clipping) : 1.0;
}

// One phase of local rank `index`'s flush, written once for both run modes.
// Threaded, a rank runs every phase on its own thread and waits for the
// other ranks' tied-gradient copy and the all-reduce; serial, every rank runs
// a phase before any runs the next, so nothing has to wait.
template <class StageT>
bool BasicPipelineEngine<StageT>::flush_step(FlushStep step, LocalRank& r, std::size_t index, StepMode mode,
                                             RunMode run, double lr, Flush& flush) {
  BasicRankWorker<StageT>& w = *r.worker;
  switch (step) {
    case FlushStep::kReduceDataParallel:
      if (options_.data_parallel > 1) reduce_data_parallel(r);
      return true;
    case FlushStep::kReduceSequenceParallel:
      if (sequence_parallel()) reduce_sequence_parallel(r);
      return true;
    case FlushStep::kPostTiedGradients:
      flush.tied_start[index] = Clock::now();
      return w.post_tied_gradients() != WorkerOutcome::kAborted;
    case FlushStep::kReduceTiedGradients: {
      const WorkerOutcome outcome = w.reduce_tied_gradients(run == RunMode::kThreaded);
      if (outcome == WorkerOutcome::kNotReady) {
        fail("serial run: rank {}'s tied-gradient copy was not posted", r.rank);
      }
      if (outcome == WorkerOutcome::kDone) w.record_phase(FlushPhase::kTiedGradients, flush.tied_start[index]);
      return outcome != WorkerOutcome::kAborted;
    }
    case FlushStep::kGradientNorm: {
      const Clock::time_point start = Clock::now();
      double sum = w.gradient_square_sum() + loss_guard(w, schedule_.num_microbatches());
      if (options_.data_parallel > 1) {  // the replicas' parts, in replica order
        const std::vector<double> parts = r.data->all_gather({&sum, 1}, deadline_after(options_.timeout),
                                                             "every replica's part of the gradient norm");
        sum = 0;
        for (const double part : parts) sum += part;
      }
      double small = w.small_square_sum();
      if (options_.tensor_parallel > 1) {  // the tensor-parallel ranks' parts, in rank order
        const double mine[] = {sum, small};
        const std::vector<double> parts = r.tensor->all_gather(mine, deadline_after(options_.timeout),
                                                               "every tensor-parallel rank's part of the gradient norm");
        sum = 0;
        small = 0;
        for (std::size_t k = 0; k < parts.size(); k += 2) {
          sum += parts[k];
          small += parts[k + 1];
        }
      }
      if (run == RunMode::kThreaded && w.all_reduce_sum(sum) == WorkerOutcome::kAborted) return false;
      if (w.measures_noise_scale() && run == RunMode::kThreaded &&
          w.all_reduce_sum(small) == WorkerOutcome::kAborted) {
        return false;
      }
      w.record_phase(FlushPhase::kGradientNorm, start);
      flush.square_sum[index] = sum;
      flush.small_square_sum[index] = small;
      return true;
    }
    case FlushStep::kUpdate:
      // Every rank holds the same norm, so all skip a non-finite step together.
      if (mode == StepMode::kTrain && std::isfinite(flush.grad_norm(index, run))) {
        flush.updating.store(true);
        w.apply_update(clip_coefficient(mode, flush.grad_norm(index, run)) / flush.loss_scale, lr);
        if (sharded()) gather_parameters(r);
      }
      return true;
  }
  return true;
}

// Each rank on its own worker of the rank group: its actions, its flush,
// then the step's results gathered. A failing rank aborts the transports;
// the others return at their next action or wait (the group's policy).
template <class StageT>
void BasicPipelineEngine<StageT>::run_threaded(StepMode mode, double lr, Flush& flush, StepResult& result,
                                  Clock::time_point epoch) {
  std::vector<Clock::time_point> ends(ranks_.size(), epoch);
  const auto job = [&](int world_rank) {
    const std::size_t at = local_index(world_rank);
    LocalRank& r = *ranks_[at];
    BasicRankWorker<StageT>& w = *r.worker;
    w.zero_gradients();
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (w.run(i, true) == WorkerOutcome::kAborted) return;
      post_reductions_after(r, i);
    }
    for (const FlushStep step : kFlushOrder) {
      if (!flush_step(step, r, at, mode, RunMode::kThreaded, lr, flush)) return;
    }
    w.complete_sends();
    ends[at] = Clock::now();
    // The process's first rank keeps the figures: every rank holds the
    // losses, and world rank 0, the first of its process, the records.
    gather_results(r, at == 0 ? &result : nullptr, epoch);
  };
  group_->run(job, [this] { abort_transports(); });
  result.wall_s = std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) - epoch).count();
}

// Every rank on this thread: passes over the ranks, each running as far as
// its messages allow, until all lists are done; then the flush phase by phase.
template <class StageT>
void BasicPipelineEngine<StageT>::run_serial(StepMode mode, double lr, Flush& flush) {
  std::vector<std::size_t> next(ranks_.size(), 0);
  for (auto& r : ranks_) r->worker->zero_gradients();
  for (bool done = false; !done;) {
    done = true;
    bool moved = false;
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      BasicRankWorker<StageT>& w = *ranks_[r]->worker;
      while (next[r] < w.size() && w.run(next[r], false) == WorkerOutcome::kDone) {
        ++next[r];
        moved = true;
      }
      done = done && next[r] == w.size();
    }
    if (!done && !moved) fail("serial run of {} is stuck although the schedule validated", schedule_.name());
  }
  for (const FlushStep step : kFlushOrder) {
    for (std::size_t r = 0; r < ranks_.size(); ++r) flush_step(step, *ranks_[r], r, mode, RunMode::kSerial, lr, flush);
  }
}

template <class StageT>
void BasicPipelineEngine<StageT>::post_reductions_after(LocalRank& r, std::size_t index) {
  if (r.reduce_after.empty()) return;
  for (auto& reduction : r.reductions) reduction.parts->poll();
  for (const StageId s : r.reduce_after[index]) post_reduction(r, s);
}

template <class StageT>
void BasicPipelineEngine<StageT>::post_reduction(LocalRank& r, StageId s) {
  r.reductions.push_back(
      {s,
       r.data->reduce_scatter_parts(r.replica->stages[static_cast<std::size_t>(s.value())]->gradients(),
                                    fmt::format("the data-parallel reduce-scatter of stage {}'s gradients", s),
                                    static_cast<std::size_t>(options_.reduce_bucket_size)),
       Clock::now()});
}

// Every stage's reduce-scatter (the rest posted now), in the order posted,
// then the all-gather of its summed gradients; under ZeRO-1 each replica
// keeps its part and the weights are gathered after the update instead.
// Each stage is recorded from its posting or the end of the stage before,
// so that the phases do not overlap.
template <class StageT>
void BasicPipelineEngine<StageT>::reduce_data_parallel(LocalRank& r) {
  for (const StageId s : schedule_.stages_of(r.rank)) {
    const bool posted = std::any_of(r.reductions.begin(), r.reductions.end(),
                                    [&](const auto& reduction) { return reduction.stage == s; });
    if (!posted) post_reduction(r, s);
  }
  Clock::time_point previous_end = Clock::time_point::min();
  for (auto& reduction : r.reductions) {
    reduction.parts->finish(deadline_after(options_.timeout));
    if (!sharded()) {
      r.data->all_gather_parts(r.replica->stages[static_cast<std::size_t>(reduction.stage.value())]->gradients(),
                               deadline_after(options_.timeout),
                               fmt::format("every replica's summed part of stage {}'s gradients", reduction.stage));
    }
    r.worker->record_phase(FlushPhase::kDataParallelGradients, reduction.stage,
                           std::max(reduction.posted, previous_end));
    previous_end = Clock::now();
  }
  r.reductions.clear();
}

template <class StageT>
std::int64_t BasicPipelineEngine<StageT>::optimizer_state_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& optimizer : first_replica().optimizers) {
    if (optimizer) bytes += 2 * static_cast<std::int64_t>(sizeof(float)) * optimizer->shard().size();
  }
  return bytes;
}

template <class StageT>
std::int64_t BasicPipelineEngine<StageT>::local_parameter_count() const {
  std::int64_t count = 0;
  for (const auto& stage : first_replica().stages) {
    if (stage) count += stage->layout().total();
  }
  return count;
}

template <class StageT>
bool BasicPipelineEngine<StageT>::sequence_parallel() const {
  return options_.sequence_parallel && options_.tensor_parallel > 1;
}

// Under sequence parallelism each tensor-parallel rank's gradients of the
// whole tensors (norms, row-parallel biases, wpe) cover its positions only:
// summed over the group, packed into one all-reduce per stage, they are the
// whole batch's on every rank.
template <class StageT>
void BasicPipelineEngine<StageT>::reduce_sequence_parallel(LocalRank& r) {
  for (const StageId s : schedule_.stages_of(r.rank)) {
    const Clock::time_point start = Clock::now();
    StageT& stage = *r.replica->stages[static_cast<std::size_t>(s.value())];
    std::vector<float> packed;
    for (const nn::ParameterInfo& info : stage.layout().entries()) {
      if (info.split()) continue;
      const auto g = stage.gradient(info.name);
      packed.insert(packed.end(), g.begin(), g.end());
    }
    r.tensor->all_reduce_sum(packed, deadline_after(options_.timeout),
                             fmt::format("the sequence-parallel sum of stage {}'s whole tensors' gradients", s),
                             packed.size());
    std::size_t at = 0;
    for (const nn::ParameterInfo& info : stage.layout().entries()) {
      if (info.split()) continue;
      const auto g = stage.gradient(info.name);
      std::copy_n(packed.begin() + static_cast<std::ptrdiff_t>(at), g.size(), g.begin());
      at += g.size();
    }
    r.worker->record_phase(FlushPhase::kSequenceParallelGradients, s, start);
  }
}

template <class StageT>
bool BasicPipelineEngine<StageT>::sharded() const { return options_.shard_optimizer && options_.data_parallel > 1; }

// ZeRO-1: each replica updated its shard of the rank's stages; every
// replica gets the others'.
template <class StageT>
void BasicPipelineEngine<StageT>::gather_parameters(LocalRank& r) {
  for (const StageId s : schedule_.stages_of(r.rank)) {
    const Clock::time_point start = Clock::now();
    r.data->all_gather_parts(r.replica->stages[static_cast<std::size_t>(s.value())]->parameters(),
                             deadline_after(options_.timeout),
                             fmt::format("every replica's updated shard of stage {} (ZeRO-1)", s));
    r.worker->record_phase(FlushPhase::kDataParallelWeights, s, start);
  }
}

// Every rank in this process, one pipeline: the losses from the last stage's
// rank, every rank's record.
template <class StageT>
void BasicPipelineEngine<StageT>::finish_serial(StepResult& result) const {
  const int m = schedule_.num_microbatches();
  for (const auto& r : ranks_) {
    if (!r->worker->holds_last_stage()) continue;
    double sum = 0;
    for (int j = 0; j < m; ++j) {
      result.microbatch_losses.push_back(r->worker->microbatch_loss(j));
      sum += r->worker->microbatch_loss(j);
    }
    result.loss = sum / m;
  }
  for (const auto& r : ranks_) result.ranks.push_back(r->worker->record());
}

namespace {

// A RankRecord as doubles, to gather at world rank 0: the epoch (seconds of
// rank 0's steady clock), the peak, the counts, then 9 numbers per action, 4
// per phase and 4 per tensor-parallel collective.
std::string record_bytes(const RankRecord& record, double epoch_s) {
  std::vector<double> v{epoch_s, static_cast<double>(record.peak_activation_bytes),
                        static_cast<double>(record.actions.size()), static_cast<double>(record.phases.size()),
                        static_cast<double>(record.collectives.size())};
  for (const ActionTiming& t : record.actions) {
    v.insert(v.end(), {static_cast<double>(t.action.stage.value()), static_cast<double>(t.action.kind),
                       static_cast<double>(t.action.microbatch.value()), t.start_s, t.end_s, t.wait_s,
                       t.cpu_s, static_cast<double>(t.held_bytes), static_cast<double>(t.working_bytes)});
  }
  for (const PhaseTiming& p : record.phases) {
    v.insert(v.end(), {static_cast<double>(p.phase), static_cast<double>(p.stage.value()), p.start_s, p.end_s});
  }
  for (const CollectiveTiming& c : record.collectives) {
    v.insert(v.end(), {c.start_s, c.end_s, static_cast<double>(c.bytes), c.cpu_s});
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
  const auto collectives = static_cast<std::size_t>(v.at(4));
  std::size_t i = 5;
  for (std::size_t a = 0; a < actions; ++a, i += 9) {
    const Action action{StageId(static_cast<int>(v.at(i))), static_cast<ActionKind>(static_cast<int>(v.at(i + 1))),
                        MicrobatchId(static_cast<int>(v.at(i + 2)))};
    record.actions.push_back({.action = action,
                              .start_s = v.at(i + 3) + shift,
                              .end_s = v.at(i + 4) + shift,
                              .wait_s = v.at(i + 5),
                              .cpu_s = v.at(i + 6),
                              .held_bytes = static_cast<std::int64_t>(v.at(i + 7)),
                              .working_bytes = static_cast<std::int64_t>(v.at(i + 8))});
  }
  for (std::size_t p = 0; p < phases; ++p, i += 4) {
    record.phases.push_back({.phase = static_cast<FlushPhase>(static_cast<int>(v.at(i))),
                             .stage = StageId(static_cast<int>(v.at(i + 1))),
                             .start_s = v.at(i + 2) + shift,
                             .end_s = v.at(i + 3) + shift});
  }
  for (std::size_t c = 0; c < collectives; ++c, i += 4) {
    record.collectives.push_back({.start_s = v.at(i) + shift,
                                  .end_s = v.at(i + 1) + shift,
                                  .bytes = static_cast<std::int64_t>(v.at(i + 2)),
                                  .cpu_s = v.at(i + 3)});
  }
  return record;
}

}  // namespace

// Every rank gets the losses (from the last pipeline rank of every replica,
// in replica order); world rank 0 gets its replica's records, each moved
// onto rank 0's epoch; the other ranks of replica 0's pipeline nothing, and
// the other replicas' ranks their own.
template <class StageT>
void BasicPipelineEngine<StageT>::gather_results(LocalRank& r, StepResult* result, Clock::time_point epoch) const {
  const int m = schedule_.num_microbatches();
  const BasicRankWorker<StageT>& w = *r.worker;
  // Every tensor-parallel rank of the last stage holds the losses: the first reports them.
  const bool reports_losses = w.holds_last_stage() && r.tensor_rank == 0;
  std::vector<double> mine{reports_losses ? 1.0 : 0.0};
  for (int j = 0; j < m; ++j) mine.push_back(reports_losses ? w.microbatch_loss(j) : 0.0);
  const std::vector<double> all =
      r.world->all_gather(mine, deadline_after(options_.timeout), "the micro-batch losses of every replica");
  std::vector<std::string> records;
  const double epoch_s =
      std::chrono::duration<double>(epoch.time_since_epoch()).count() - group_->clock_offset_s();
  RankRecord record = w.record();
  if (r.tensor_collectives) record.collectives = r.tensor_collectives->take(epoch);
  if (r.data_rank == 0 && r.tensor_rank == 0) {
    records = r.pipeline->gather_bytes(record_bytes(record, epoch_s), deadline_after(options_.timeout),
                                       "every pipeline rank's timings of the step");
  }
  if (result == nullptr) return;
  double sum = 0;
  for (std::size_t at = 0; at < all.size(); at += mine.size()) {
    if (all[at] != 1.0) continue;
    for (int j = 1; j <= m; ++j) {
      result->microbatch_losses.push_back(all[at + static_cast<std::size_t>(j)]);
      sum += all[at + static_cast<std::size_t>(j)];
    }
  }
  result->loss = sum / static_cast<double>(result->microbatch_losses.size());
  for (const std::string& part : records) {
    double their_epoch_s = 0;
    std::memcpy(&their_epoch_s, part.data(), sizeof their_epoch_s);
    result->ranks.push_back(parse_record(part, their_epoch_s - epoch_s));
  }
  if (result->ranks.empty()) result->ranks.push_back(std::move(record));
}

template class BasicPipelineEngine<nn::Stage>;
template class BasicPipelineEngine<nn::VlmStage>;

}  // namespace pipeflow::runtime
