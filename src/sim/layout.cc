#include "pipeflow/sim/layout.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pipeflow/config/rules.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/units.h"

namespace pipeflow {
namespace {

void require_positive(int value, std::string_view what, std::string_view fix) {
  if (value < 1) fail("{} = {}: must be >= 1: {}", what, value, fix);
}

}  // namespace

Layout layout_of(const ResolvedRun& run) {
  const RunConfig& keys = run.config;
  Layout layout;
  layout.model = run.model;
  layout.hardware = keys.hardware;
  layout.devices = run.devices;
  layout.tensor_parallel = keys.tensor_parallel;
  layout.pipeline_ranks = keys.pipeline.ranks;
  layout.data_parallel = keys.data_parallel;
  layout.micro_batch = run.batch.micro;
  layout.global_batch = run.batch.global;
  layout.seq_length = run.seq_length;
  layout.variable_seq_lengths = run.microbatch_lengths;
  layout.variable_images = keys.variable_images;
  layout.schedule = keys.pipeline.file_schedule ? keys.pipeline.file_schedule->name() : keys.pipeline.schedule;
  layout.file_schedule = keys.pipeline.file_schedule;
  layout.chunks = keys.pipeline.chunks;
  layout.recompute = run.recompute;
  layout.recompute_interval = std::max(1, keys.pipeline.recompute_interval);
  layout.sequence_parallel = run.sequence_parallel;
  layout.partition = keys.pipeline.partition_method;
  layout.zero = keys.zero;
  layout.comm_mode = keys.comm_mode;
  layout.block_launch_overhead_s = keys.block_launch_overhead_s;
  layout.rank_order = keys.rank_order;
  layout.precision = keys.precision;
  layout.gradient_precision = keys.communication_data_type.value_or(keys.precision);
  layout.gradient_accumulation = run.gradient_accumulation;
  layout.training = keys.training;
  return layout;
}

void validate_layout(const Layout& layout) {
  require_positive(layout.tensor_parallel, "tensor parallel", "use 1 for no tensor parallelism");
  require_positive(layout.pipeline_ranks, "pipeline parallel", "use 1 for a single stage");
  require_positive(layout.data_parallel, "data parallel", "use 1 for a single replica");
  require_positive(layout.devices, "devices", "give the number of devices");
  require_positive(layout.micro_batch, "micro-batch", "give the sequences per micro-batch");
  require_positive(layout.global_batch, "global batch", "give the sequences per step");
  require_positive(layout.chunks, "virtual stages", "use 1 for one chunk per rank");
  require_positive(layout.seq_length, "seq_length", "give the tokens per sequence");

  const int t = layout.tensor_parallel;
  const int p = layout.pipeline_ranks;
  const int d = layout.data_parallel;
  check_device_count(layout.devices, t, p, d);
  if (layout.sequence_parallel) check_sequence_parallel_split(layout.seq_length, t);
  const int per_step = checked_product({layout.micro_batch, d}, "micro-batch × data parallel", "sequences per step");
  if (layout.global_batch % per_step != 0) {
    fail("global batch {} is not a multiple of micro-batch × data parallel = {} × {} = {}: use a global batch of {}",
         layout.global_batch, layout.micro_batch, d, per_step, nearest_multiples(layout.global_batch, per_step));
  }
  check_microbatch_shapes(layout.variable_seq_lengths, layout.variable_images, layout.seq_length, layout.model,
                          layout.global_batch / per_step, layout.sequence_parallel ? t : 1);
}

bool microbatches_differ(const Layout& layout) {
  return !layout.variable_seq_lengths.empty() || !layout.variable_images.empty();
}

std::vector<MicrobatchShape> microbatch_shapes(const Layout& layout, int m) {
  const auto at = [](const std::vector<int>& list, int i, int otherwise) {
    return list.empty() ? otherwise : list[static_cast<std::size_t>(i) % list.size()];
  };
  const int images = layout.model.vision ? layout.model.vision->images : 0;
  std::vector<MicrobatchShape> shapes;
  for (int i = 0; i < m; ++i) {
    shapes.push_back({at(layout.variable_seq_lengths, i, layout.seq_length), at(layout.variable_images, i, images)});
  }
  return shapes;
}

Layout with_microbatch_shape(Layout layout, MicrobatchShape shape) {
  layout.seq_length = shape.seq_length;
  if (layout.model.vision) layout.model.vision->images = shape.images;
  layout.variable_seq_lengths.clear();
  layout.variable_images.clear();
  return layout;
}

int microbatches_per_step(const Layout& layout) {
  validate_layout(layout);
  return layout.global_batch / (layout.micro_batch * layout.data_parallel);
}

ParallelConfig parallel_config(const Layout& layout) {
  ParallelConfig config;
  config.micro_batch = layout.micro_batch;
  config.seq_length = layout.seq_length;
  config.tensor_parallel = layout.tensor_parallel;
  config.sequence_parallel = layout.sequence_parallel;
  config.recompute = layout.recompute;
  config.scatter_gather = layout.tensor_parallel > 1;
  config.bytes_per_element = bytes_per_element(layout.precision);
  return config;
}

std::vector<PipelineLayer> layout_layers(const Layout& layout, const ParallelConfig& config) {
  std::vector<PipelineLayer> layers = pipeline_layers(layout.model, config);
  apply_training(layers, layout.model, config, layout.training);
  return layers;
}

ParallelConfig whole_model_config(const Layout& layout) {
  ParallelConfig whole = parallel_config(layout);
  whole.tensor_parallel = 1;
  whole.sequence_parallel = false;
  whole.scatter_gather = false;
  return whole;
}

TrainingSummary training_summary(const Layout& layout) {
  const std::vector<PipelineLayer> layers = layout_layers(layout, whole_model_config(layout));
  const LayerTotals totals = sum_layers(layers);
  TrainingSummary out{totals.parameters, totals.trainable_parameters, static_cast<int>(layers.size()), {}, 0, 0};
  for (const PipelineLayer& layer : layers) {
    if (layer.frozen && layer.trainable_parameters == 0) out.frozen.push_back(layer.name);
    if (layer.frozen && layer.trainable_parameters > 0) ++out.adapted;
    if (!layer.backward) ++out.without_backward;
  }
  return out;
}

std::string TrainingSummary::without_backward_range() const {
  if (without_backward == 0) return "";
  const std::string& last = frozen[static_cast<std::size_t>(without_backward - 1)];
  return without_backward == 1 ? last : frozen.front() + ".." + last;
}

std::string TrainingSummary::trainable_note() const {
  if (trainable_parameters == parameters) return "";
  return fmt::format("the {} trainable parameters (the {} frozen have no gradients or optimizer state)",
                     format_parameters(static_cast<double>(trainable_parameters)),
                     format_parameters(static_cast<double>(parameters - trainable_parameters)));
}

std::string TrainingSummary::no_backward_note() const {
  if (without_backward == 0) return "";
  return fmt::format("{}, frozen before any trainable layer, run{} no backward: they keep no activations and "
                     "recompute nothing",
                     without_backward_range(), without_backward == 1 ? "s" : "");
}

HardwareProfile priced_hardware(const Layout& layout) { return layout.hardware.at_precision(layout.precision); }

}  // namespace pipeflow
