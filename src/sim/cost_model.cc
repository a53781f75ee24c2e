#include "pipeflow/sim/cost_model.h"

#include "pipeflow/core/error.h"
#include "pipeflow/model/model_states.h"
#include "pipeflow/schedule/generators.h"

namespace pipeflow {
namespace {

// Index of the first device of pipeline rank r (tp rank 0, dp rank 0).
int first_device(const Layout& layout, RankId rank) {
  return rank.value() * layout.tensor_parallel * layout.data_parallel;
}

StageCosts price_stage(const Layout& layout, const std::vector<PipelineLayer>& layers, const StagePlan& plan,
                       const LinkCost& tensor_link) {
  const ModelSpec& model = layout.model;
  const ParallelConfig config = parallel_config(layout);
  const HardwareProfile& hw = layout.hardware;
  const LayerTotals totals = sum_layers(layers, plan.first, plan.end);

  StageCosts stage;
  double tp_forward = 0;
  double tp_backward = 0;
  for (int i = plan.first; i < plan.end; ++i) {
    const PipelineLayer& layer = layers[static_cast<std::size_t>(i)];
    const TensorParallelSeconds tp = tensor_parallel_seconds(model, config, layer.kind, tensor_link);
    tp_forward += tp.forward_s;
    tp_backward += tp.backward_input_s;
    stage.weight_gradient_bytes += weight_gradient_bytes(model, config, layer.kind);
  }
  stage.forward_s = compute_seconds(totals.forward_flops, hw) + tp_forward;
  stage.backward_input_s =
      compute_seconds(totals.backward_input_flops + totals.recompute_flops, hw) + tp_backward;
  stage.backward_weight_s = compute_seconds(totals.backward_weight_flops, hw);
  stage.backward_s = stage.backward_input_s + stage.backward_weight_s;
  stage.output_bytes = layers[static_cast<std::size_t>(plan.end - 1)].output_bytes;

  const std::int64_t parameters = plan.parameters;
  stage.model_state_bytes = model_state_bytes(parameters, layout.zero, layout.data_parallel).total();
  stage.activation_bytes = totals.activation_bytes;
  stage.gradient_bytes = kGradientBytesPerParameter * static_cast<double>(parameters);
  const double local = layout.zero == ZeroStage::kNone
                           ? static_cast<double>(parameters)
                           : static_cast<double>(parameters) / layout.data_parallel;
  stage.optimizer_s = kOptimizerBytesPerParameter * local / hw.memory_bandwidth_bytes_per_s;
  return stage;
}

// One send and one receive buffer for each message a stage exchanges: its
// input and its output, each in both directions (activation and gradient).
void add_comm_buffers(std::vector<StageCosts>& stages) {
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const double input = s == 0 ? 0 : stages[s - 1].output_bytes;
    const double output = s + 1 == stages.size() ? 0 : stages[s].output_bytes;
    stages[s].comm_buffer_bytes = 2 * (input + output);
  }
}

LinkTable pipeline_links(const Layout& layout, const Schedule& schedule) {
  LinkTable links;
  for (int s = 0; s + 1 < schedule.num_stages(); ++s) {
    const RankId a = schedule.rank_of(StageId(s));
    const RankId b = schedule.rank_of(StageId(s + 1));
    if (a == b) continue;
    const LinkCost link = link_cost(link_between(layout.hardware, first_device(layout, a), first_device(layout, b)));
    links.set(a, b, link);
    links.set(b, a, link);
  }
  return links;
}

// The data-parallel group of rank r spans devices first .. first + (d − 1)·t;
// a ring over it runs at the slowest link it crosses.
std::vector<LinkCost> data_parallel_links(const Layout& layout, int ranks) {
  std::vector<LinkCost> links;
  for (int r = 0; r < ranks; ++r) {
    const int first = first_device(layout, RankId(r));
    const int last = first + (layout.data_parallel - 1) * layout.tensor_parallel;
    links.push_back(link_cost(link_between(layout.hardware, first, last)));
  }
  return links;
}

}  // namespace

double weight_gradient_bytes(const ModelSpec& model, const ParallelConfig& config, LayerKind kind) {
  const double t = config.tensor_parallel;
  const double sp = config.sequence_parallel ? t : 1;
  const double ebs = static_cast<double>(config.bytes_per_element) * config.micro_batch * config.seq_length;
  const double h = model.hidden;
  const double f = model.ffn;
  switch (kind) {
    case LayerKind::kEmbedding:
      return ebs * h / sp;
    case LayerKind::kHead:
      return ebs * (h / sp + static_cast<double>(model.vocab) / t);
    case LayerKind::kBlock:
      if (model.architecture == Architecture::kGpt) return ebs * (4 * h / sp + (4 * h + 2 * f) / t);
      return ebs * (4 * h / sp + (2 * h + kv_width(model) + 3 * f) / t);
  }
  return 0;
}

TensorParallelSeconds tensor_parallel_seconds(const ModelSpec& model, const ParallelConfig& config, LayerKind kind,
                                              const LinkCost& link) {
  const int t = config.tensor_parallel;
  if (t <= 1) return {};
  const double activation = static_cast<double>(config.bytes_per_element) * config.micro_batch * config.seq_length *
                            model.hidden;
  const double all_reduce = ring_all_reduce_seconds(activation, t, link);
  switch (kind) {
    case LayerKind::kEmbedding:
      return {all_reduce, 0};
    case LayerKind::kHead:
      return {0, all_reduce};
    case LayerKind::kBlock: {
      const double recompute = config.recompute == Recompute::kFull ? 2 * all_reduce : 0;
      return {2 * all_reduce, 2 * all_reduce + recompute};
    }
  }
  return {};
}

LinkCost link_cost(const Link& link) { return LinkCost{link.latency_s, link.bandwidth_bytes_per_s}; }

Schedule layout_schedule(const Layout& layout) {
  if (layout.file_schedule) return *layout.file_schedule;
  return make_schedule(layout.schedule, layout.pipeline_parallel, microbatches_per_step(layout),
                       layout.virtual_stages);
}

LayoutCosts layout_costs(const Layout& layout, const Schedule& schedule) {
  validate_layout(layout);
  validate_hardware(layout.hardware);
  if (schedule.num_ranks() != layout.pipeline_parallel) {
    fail("internal: schedule {} has {} ranks but the layout {} pipeline stages", schedule.name(),
         schedule.num_ranks(), layout.pipeline_parallel);
  }
  const ParallelConfig config = parallel_config(layout);
  const std::vector<PipelineLayer> layers = pipeline_layers(layout.model, config);
  if (schedule.num_stages() > static_cast<int>(layers.size())) {
    const std::string stages = schedule.stages_per_rank() == 1
                                   ? fmt::format("{} stages", schedule.num_stages())
                                   : fmt::format("{} ranks × {} chunks = {} stages", schedule.num_ranks(),
                                                 schedule.stages_per_rank(), schedule.num_stages());
    fail("{} for {}'s {} pipeline layers (embedding, {} blocks, head): every stage needs a layer; use fewer "
         "pipeline stages or virtual stages",
         stages, layout.model.name, layers.size(), layout.model.layers);
  }
  LayoutCosts out;
  out.partition = partition_layers(layers, schedule.num_stages(), layout.partition, layout.hardware);

  const LinkCost tensor_link =
      link_cost(link_between(layout.hardware, 0, layout.tensor_parallel - 1));
  for (const StagePlan& plan : out.partition.stages) {
    out.costs.stages.push_back(price_stage(layout, layers, plan, tensor_link));
  }
  add_comm_buffers(out.costs.stages);
  out.costs.links = pipeline_links(layout, schedule);
  out.costs.comm_mode = layout.comm_mode;
  out.costs.data_parallel = layout.data_parallel;
  out.costs.data_parallel_links = data_parallel_links(layout, schedule.num_ranks());

  // Whole-model FLOPs: the layers without tensor parallelism, once per
  // micro-batch of every replica (B / b of them).
  ParallelConfig whole = config;
  whole.tensor_parallel = 1;
  whole.sequence_parallel = false;
  whole.scatter_gather = false;
  const LayerTotals totals = sum_layers(pipeline_layers(layout.model, whole));
  const double microbatches = static_cast<double>(layout.global_batch) / layout.micro_batch;
  out.model_flops_per_step = totals.model_flops() * microbatches;
  out.hardware_flops_per_step = totals.hardware_flops() * microbatches;
  out.tokens_per_step = static_cast<double>(layout.global_batch) * config.seq_length;
  return out;
}

}  // namespace pipeflow
