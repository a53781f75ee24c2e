#include "pipeflow/sim/layout.h"

#include <fmt/ranges.h>

#include <cstdint>
#include <limits>

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

void require_positive(int value, std::string_view what, std::string_view fix) {
  if (value < 1) fail("{} = {}: must be >= 1: {}", what, value, fix);
}

}  // namespace

int checked_product(std::initializer_list<int> factors, std::string_view what, std::string_view unit) {
  constexpr std::int64_t kMax = std::numeric_limits<int>::max();
  std::int64_t product = 1;
  for (int factor : factors) {
    if (factor < 1) fail("internal: {} has a factor {} < 1", what, factor);
    product *= factor;  // both sides <= kMax, so this fits in 64 bits
    if (product > kMax) {
      fail("{} = {}: more than {} {}: use smaller sizes", what, fmt::join(factors, " × "), kMax, unit);
    }
  }
  return static_cast<int>(product);
}

std::string nearest_multiples(int value, int unit) {
  const std::int64_t below = value / unit * static_cast<std::int64_t>(unit);
  if (below == 0) return fmt::format("{}", unit);
  return fmt::format("{} or {}", below, below + unit);
}

void validate_layout(const Layout& layout) {
  require_positive(layout.tensor_parallel, "tensor parallel", "use 1 for no tensor parallelism");
  require_positive(layout.pipeline_parallel, "pipeline parallel", "use 1 for a single stage");
  require_positive(layout.data_parallel, "data parallel", "use 1 for a single replica");
  require_positive(layout.devices, "devices", "give the number of devices");
  require_positive(layout.micro_batch, "micro-batch", "give the sequences per micro-batch");
  require_positive(layout.global_batch, "global batch", "give the sequences per step");
  require_positive(layout.virtual_stages, "virtual stages", "use 1 for one chunk per rank");
  if (layout.sequence < 0) fail("sequence = {}: must be >= 1 (0 takes the model's context)", layout.sequence);

  const int t = layout.tensor_parallel;
  const int p = layout.pipeline_parallel;
  const int d = layout.data_parallel;
  const int devices = checked_product({t, p, d}, "tensor × pipeline × data parallel", "devices");
  if (layout.devices != devices) {
    const int model_parallel = t * p;
    const std::string fix = layout.devices % model_parallel == 0
                                ? fmt::format("use data parallel {} or devices {}", layout.devices / model_parallel,
                                              devices)
                                : fmt::format("use devices {}", devices);
    fail("devices = {} but tensor × pipeline × data parallel = {} × {} × {} = {}: {}", layout.devices, t, p, d,
         devices, fix);
  }
  const int sequence = sequence_length(layout);
  if (layout.sequence_parallel && t > 1 && sequence % t != 0) {
    fail("sequence {} with sequence parallelism over tensor parallel {}: Megatron splits the sequence over the "
         "tensor-parallel ranks, so it must be a multiple of tensor parallel: use sequence {} or drop sequence "
         "parallelism",
         sequence, t, nearest_multiples(sequence, t));
  }
  const int per_step = checked_product({layout.micro_batch, d}, "micro-batch × data parallel", "sequences per step");
  if (layout.global_batch % per_step != 0) {
    fail("global batch {} is not a multiple of micro-batch × data parallel = {} × {} = {}: use a global batch of {}",
         layout.global_batch, layout.micro_batch, d, per_step, nearest_multiples(layout.global_batch, per_step));
  }
}

int microbatches_per_step(const Layout& layout) {
  validate_layout(layout);
  return layout.global_batch / (layout.micro_batch * layout.data_parallel);
}

int sequence_length(const Layout& layout) {
  return layout.sequence > 0 ? layout.sequence : layout.model.max_positions;
}

ParallelConfig parallel_config(const Layout& layout) {
  ParallelConfig config;
  config.micro_batch = layout.micro_batch;
  config.sequence = sequence_length(layout);
  config.tensor_parallel = layout.tensor_parallel;
  config.sequence_parallel = layout.sequence_parallel;
  config.recompute = layout.recompute;
  config.scatter_gather = layout.tensor_parallel > 1;
  return config;
}

}  // namespace pipeflow
