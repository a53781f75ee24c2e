#include "pipeflow/sim/prediction.h"

#include <algorithm>
#include <cmath>

#include "pipeflow/core/error.h"
#include "pipeflow/core/units.h"
#include "pipeflow/schedule/passes.h"

namespace pipeflow {
namespace {

// What can shrink a rank's memory, strongest first, given what the layout
// already does.
std::string memory_fixes(const Layout& layout) {
  std::string fixes;
  if (layout.recompute == Recompute::kNone) fixes += "--recompute selective or full, ";
  if (layout.recompute == Recompute::kSelective) fixes += "--recompute full, ";
  if (layout.tensor_parallel > 1 && !layout.sequence_parallel) fixes += "--sequence-parallel, ";
  if (layout.zero == ZeroStage::kNone && layout.data_parallel > 1) fixes += "--zero 1, ";
  fixes += "more pipeline stages (--pp)";
  if (layout.micro_batch > 1) fixes += " or a smaller --micro-batch";
  return fixes;
}

std::vector<std::string> memory_warnings(const Layout& layout, const SimulationResult& result) {
  std::vector<std::string> warnings;
  const double capacity = layout.hardware.memory_bytes;
  for (std::size_t r = 0; r < result.ranks.size(); ++r) {
    const RankResult& rank = result.ranks[r];
    if (rank.peak_memory_bytes <= capacity) continue;
    warnings.push_back(fmt::format(
        "rank {} needs {} at its peak ({} model states + {} activations + {} buffers) but {} has {} per device: "
        "use {}",
        r, format_bytes(rank.peak_memory_bytes), format_bytes(rank.model_states_bytes),
        format_bytes(rank.activation_bytes), format_bytes(rank.comm_buffer_bytes), layout.hardware.name,
        format_bytes(capacity), memory_fixes(layout)));
  }
  return warnings;
}

// The busiest rank's compute over the mean rank's.
double rank_imbalance(const SimulationResult& result) {
  double most = 0, sum = 0;
  for (const RankResult& rank : result.ranks) {
    most = std::max(most, rank.busy_s);
    sum += rank.busy_s;
  }
  return sum > 0 ? most * static_cast<double>(result.ranks.size()) / sum : 1;
}

VariableLengths variable_lengths(const Layout& layout, const LayoutCosts& costs, const SimulationResult& result) {
  VariableLengths out;
  const std::size_t m = costs.costs.microbatch_stages.size();
  double tokens = 0, images = 0, most = 0, sum = 0;
  const std::vector<MicrobatchShape> shapes = microbatch_shapes(layout, static_cast<int>(m));
  for (std::size_t i = 0; i < m; ++i) {
    out.lengths.push_back(shapes[i].seq_length);
    if (!layout.variable_images.empty()) out.images.push_back(shapes[i].images);
    tokens += shapes[i].seq_length;
    images += shapes[i].images;
    double compute = 0;
    for (const StageCosts& stage : costs.costs.microbatch_stages[i]) compute += stage.forward_s + stage.backward_s;
    most = std::max(most, compute);
    sum += compute;
  }
  out.microbatch_imbalance = sum > 0 ? most * static_cast<double>(m) / sum : 1;
  out.rank_imbalance = rank_imbalance(result);
  const int multiple = layout.sequence_parallel ? layout.tensor_parallel : 1;
  out.uniform_length =
      std::max(multiple, static_cast<int>(std::lround(tokens / static_cast<double>(m) / multiple)) * multiple);
  // Rounded down: every micro-batch's text outlasts its images, so the mean
  // length outlasts the mean images' tokens, and so a whole number below them.
  out.uniform_images = static_cast<int>(std::floor(images / static_cast<double>(m)));
  const Prediction p = predict(with_microbatch_shape(layout, {out.uniform_length, out.uniform_images}));
  out.uniform_step_time_s = p.result.step_time_s;
  out.uniform_rank_imbalance = rank_imbalance(p.result);
  return out;
}

}  // namespace

Prediction predict(const Layout& layout, const MeasuredProfile* profile) {
  const Schedule made = layout_schedule(layout);
  if (profile != nullptr && microbatches_differ(layout)) {
    fail("{} with a measured profile (--profile): the profile's durations are one micro-batch shape's, and "
         "micro-batches of their own shapes are priced by the cost model alone; drop one of the two",
         layout.variable_seq_lengths.empty() ? "variable_images" : "variable_seq_lengths");
  }
  LayoutCosts costs = layout_costs(layout, made);
  if (profile != nullptr) apply_profile(*profile, costs.costs);
  // A lowered schedule file already holds its messages.
  const bool lower = layout.comm_mode == CommMode::kBlocking && !made.has_communication();
  Schedule schedule = lower ? insert_send_recv(made) : made;
  SimulationResult result = simulate(schedule, costs.costs, {.steady_state = true});

  const double step = result.step_time_s;
  const double devices = layout.devices;
  const double peak = layout.hardware.peak_at(layout.precision);
  const double per_device = step > 0 ? 1 / (step * devices) : 0;
  std::vector<std::string> warnings = memory_warnings(layout, result);
  std::optional<VariableLengths> variable;
  if (microbatches_differ(layout)) variable = variable_lengths(layout, costs, result);
  return Prediction{layout,
                    microbatches_per_step(layout),
                    std::move(schedule),
                    costs,
                    std::move(result),
                    step > 0 ? costs.tokens_per_step / step : 0,
                    costs.model_flops_per_step * per_device / peak,
                    costs.hardware_flops_per_step * per_device / peak,
                    costs.model_flops_per_step * per_device / 1e12,
                    costs.hardware_flops_per_step * per_device / 1e12,
                    std::move(warnings),
                    std::move(variable)};
}

}  // namespace pipeflow
