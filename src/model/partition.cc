#include "pipeflow/model/partition.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <regex>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

constexpr const char* kMethodHelp =
    "use uniform, parameters, type:REGEX, balanced, counts:N,N,... or bounds:0,B,...,LAYERS";

void check_stage_count(int layers, int stages) {
  if (stages < 1) fail("stages = {}: must be >= 1", stages);
  if (stages > layers) {
    fail("{} stages for {} pipeline layers: every stage needs at least one layer; use at most {} stages", stages,
         layers, layers);
  }
}

// Prefix sums so that a stage's weight is prefix[end] - prefix[first], the
// same expression everywhere (the optimum is then compared exactly).
std::vector<double> prefix_sums(std::span<const double> weights) {
  std::vector<double> prefix(weights.size() + 1, 0.0);
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] >= 0) || !std::isfinite(weights[i])) {
      fail("layer weight {} = {}: weights must be finite and >= 0", i, weights[i]);
    }
    prefix[i + 1] = prefix[i] + weights[i];
  }
  return prefix;
}

// first[i]: the smallest k with prefix[i] - prefix[k] <= cap. A stage's sum
// falls (or stays) as its first layer k rises, exactly in floating point
// too (rounding is monotone), so the stages [k, i) within the cap are those
// with k in [first[i], i]; first rises with i.
std::vector<int> first_within(const std::vector<double>& prefix, int n, double cap) {
  std::vector<int> first(n + 1, 0);
  for (int i = 0, k = 0; i <= n; ++i) {
    while (prefix[i] - prefix[k] > cap) ++k;
    first[i] = k;
  }
  return first;
}

// The smallest possible heaviest stage of layers [0, n) in p stages, given
// any partition's heaviest stage `known` (>= the answer): best[j][i] is the
// smallest heaviest stage when layers [0, i) form j stages, each stage at
// most `known`. The optimal partition has every stage within `known`, so
// leaving out the heavier stages changes no result, and the DP looks at
// about n / p last stages per state instead of n.
double min_bottleneck(const std::vector<double>& prefix, int n, int p, double known) {
  const std::vector<int> first = first_within(prefix, n, known);
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, kInfinity));
  best[0][0] = 0;
  for (int j = 1; j <= p; ++j) {
    for (int i = j; i <= n - (p - j); ++i) {
      for (int k = std::max(j - 1, first[i]); k < i; ++k) {
        best[j][i] = std::min(best[j][i], std::max(best[j - 1][k], prefix[i] - prefix[k]));
      }
    }
  }
  return best[p][n];
}

// light[j][i]: with every stage <= cap, the heaviest possible lightest stage
// of j stages over layers [0, i) (-inf when impossible).
std::vector<std::vector<double>> max_lightest(const std::vector<double>& prefix, int n, int p, double cap) {
  const std::vector<int> first = first_within(prefix, n, cap);
  std::vector<std::vector<double>> light(p + 1, std::vector<double>(n + 1, -kInfinity));
  light[0][0] = kInfinity;
  for (int j = 1; j <= p; ++j) {
    for (int i = j; i <= n; ++i) {
      for (int k = std::max(j - 1, first[i]); k < i; ++k) {
        light[j][i] = std::max(light[j][i], std::min(light[j - 1][k], prefix[i] - prefix[k]));
      }
    }
  }
  return light;
}

std::vector<int> parse_list(std::string_view text, std::string_view method) {
  std::vector<int> values;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    int value = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || error != std::errc() || end != item.data() + item.size()) {
      fail("partition {}: {} is not an integer; {}", quoted_excerpt(std::string(method) + std::string(text)),
           quoted_excerpt(item), kMethodHelp);
    }
    values.push_back(value);
    start = comma + 1;
  }
  return values;
}

std::vector<int> bounds_from_counts(const std::vector<int>& counts, int layers) {
  std::int64_t total = 0;  // 64 bits: counts near INT_MAX must not wrap to a plausible sum
  for (int count : counts) {
    if (count < 1) fail("partition counts:{}: every stage needs >= 1 layer (got {})", fmt::join(counts, ","), count);
    total += count;
  }
  if (total != layers) {
    fail("partition counts:{}: the counts sum to {} but the model has {} pipeline layers (embedding, blocks, head); "
         "make them sum to {}",
         fmt::join(counts, ","), total, layers, layers);
  }
  std::vector<int> bounds = {0};
  for (int count : counts) bounds.push_back(bounds.back() + count);
  return bounds;
}

void check_bounds(const std::vector<int>& bounds, int layers) {
  const bool well_formed = bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == layers &&
                           std::adjacent_find(bounds.begin(), bounds.end(), std::greater_equal<>()) == bounds.end();
  if (!well_formed) {
    fail("partition bounds:{}: boundaries must rise strictly from 0 to {} (the number of pipeline layers)",
         fmt::join(bounds, ","), layers);
  }
}

std::vector<double> type_weights(const std::vector<PipelineLayer>& layers, const std::string& pattern) {
  std::regex regex;
  try {
    regex = std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
  } catch (const std::regex_error& error) {
    fail("partition type:{}: not a valid regular expression ({})", pattern, error.what());
  }
  std::vector<double> weights;
  for (const PipelineLayer& layer : layers) weights.push_back(std::regex_search(layer.name, regex) ? 1.0 : 0.0);
  if (std::count(weights.begin(), weights.end(), 1.0) == 0) {
    fail("partition type:{}: matches no layer; layer names are embedding, block.0 ... block.{}, head", pattern,
         static_cast<int>(layers.size()) - 3);
  }
  return weights;
}

std::vector<double> parameter_weights(const std::vector<PipelineLayer>& layers) {
  std::vector<double> weights;
  for (const PipelineLayer& layer : layers) {
    weights.push_back(static_cast<double>(layer.parameters + layer.tied_parameters));
  }
  return weights;
}

std::vector<int> choose_bounds(const std::vector<PipelineLayer>& layers, int stages, const PartitionMethod& method,
                               const HardwareProfile& hardware) {
  const int n = static_cast<int>(layers.size());
  using Kind = PartitionMethod::Kind;
  switch (method.kind) {
    case Kind::kUniform: return partition_uniform(n, stages);
    case Kind::kParameters: return partition_min_max(parameter_weights(layers), stages);
    case Kind::kType: return partition_min_max(type_weights(layers, method.pattern), stages);
    case Kind::kBalanced: return partition_min_max(layer_seconds(layers, hardware), stages);
    case Kind::kCounts: return bounds_from_counts(method.values, n);
    case Kind::kBounds: check_bounds(method.values, n); return method.values;
  }
  return {};
}

StagePlan plan_stage(const std::vector<PipelineLayer>& layers, int first, int end, const HardwareProfile& hardware) {
  const LayerTotals totals = sum_layers(layers, first, end);
  StagePlan stage;
  stage.first = first;
  stage.end = end;
  for (int i = first; i < end; ++i) stage.layer_names.push_back(layers[i].name);
  stage.parameters = totals.parameters;
  stage.trainable_parameters = totals.trainable_parameters;
  stage.model_flops = totals.model_flops();
  stage.hardware_flops = totals.hardware_flops();
  stage.seconds = compute_seconds(stage.hardware_flops, hardware);
  return stage;
}

}  // namespace

std::vector<int> partition_uniform(int layers, int stages) {
  check_stage_count(layers, stages);
  const int chunk = layers / stages;
  const int extra = layers % stages;
  std::vector<int> bounds = {0};
  for (int k = 0; k < stages; ++k) bounds.push_back(bounds.back() + chunk + (k < extra ? 1 : 0));
  return bounds;
}

std::vector<int> partition_min_max(std::span<const double> weights, int stages) {
  const int n = static_cast<int>(weights.size());
  check_stage_count(n, stages);
  const std::vector<double> prefix = prefix_sums(weights);
  // Stage sums equal up to rounding (the same layers summed from different
  // prefixes) count as equal, so that ties break by the rule below and not
  // by the last bits.
  const double slack = 1e-12 * prefix[n];
  // Uniform's heaviest stage bounds the optimum's from above.
  const std::vector<int> uniform = partition_uniform(n, stages);
  double known = 0;
  for (int k = 0; k < stages; ++k) known = std::max(known, prefix[uniform[k + 1]] - prefix[uniform[k]]);
  const double cap = min_bottleneck(prefix, n, stages, known) + slack;
  const auto light = max_lightest(prefix, n, stages, cap);
  const double floor = light[stages][n] - slack;
  // Walk back from the last stage, giving each the most layers that keep it
  // within [floor, cap] and leave a feasible prefix.
  std::vector<int> bounds(stages + 1, 0);
  bounds[stages] = n;
  for (int j = stages; j >= 1; --j) {
    const int i = bounds[j];
    for (int k = j - 1; k < i; ++k) {
      const double stage = prefix[i] - prefix[k];
      if (stage <= cap && stage >= floor && light[j - 1][k] >= floor) {
        bounds[j - 1] = k;
        break;
      }
    }
  }
  return bounds;
}

PartitionMethod parse_partition_method(std::string_view text) {
  using Kind = PartitionMethod::Kind;
  if (text == "uniform") return {Kind::kUniform, "", {}};
  if (text == "parameters") return {Kind::kParameters, "", {}};
  if (text == "balanced") return {Kind::kBalanced, "", {}};
  if (text.starts_with("type:") && text.size() > 5) return {Kind::kType, std::string(text.substr(5)), {}};
  if (text.starts_with("counts:")) return {Kind::kCounts, "", parse_list(text.substr(7), "counts:")};
  if (text.starts_with("bounds:")) return {Kind::kBounds, "", parse_list(text.substr(7), "bounds:")};
  fail("unknown partition method {}: {}", quoted_excerpt(text), kMethodHelp);
}

std::string to_string(const PartitionMethod& method) {
  using Kind = PartitionMethod::Kind;
  switch (method.kind) {
    case Kind::kUniform: return "uniform";
    case Kind::kParameters: return "parameters";
    case Kind::kType: return "type:" + method.pattern;
    case Kind::kBalanced: return "balanced";
    case Kind::kCounts: return fmt::format("counts:{}", fmt::join(method.values, ","));
    case Kind::kBounds: return fmt::format("bounds:{}", fmt::join(method.values, ","));
  }
  return "?";
}

double Partition::max_stage_seconds() const {
  double slowest = 0;
  for (const StagePlan& stage : stages) slowest = std::max(slowest, stage.seconds);
  return slowest;
}

std::vector<double> layer_seconds(const std::vector<PipelineLayer>& layers, const HardwareProfile& hardware) {
  std::vector<double> seconds;
  for (const PipelineLayer& layer : layers) {
    const double flops =
        layer.forward_flops + layer.backward_input_flops + layer.backward_weight_flops + layer.recompute_flops;
    seconds.push_back(compute_seconds(flops, hardware));
  }
  return seconds;
}

Partition partition_layers(const std::vector<PipelineLayer>& layers, int stages, const PartitionMethod& method,
                           const HardwareProfile& hardware) {
  check_stage_count(static_cast<int>(layers.size()), stages);
  Partition partition;
  partition.boundaries = choose_bounds(layers, stages, method, hardware);
  const int planned = static_cast<int>(partition.boundaries.size()) - 1;
  if (planned != stages) {
    fail("partition {} has {} stages but the pipeline has {}: give {} entries", to_string(method), planned, stages,
         method.kind == PartitionMethod::Kind::kCounts ? stages : stages + 1);
  }
  for (int k = 0; k < stages; ++k) {
    partition.stages.push_back(plan_stage(layers, partition.boundaries[k], partition.boundaries[k + 1], hardware));
  }
  return partition;
}

}  // namespace pipeflow
