#include "pipeflow/model/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "../support/error_of.h"

namespace pipeflow {
namespace {

using testing::error_of;

std::vector<PipelineLayer> gpt2_layers() {
  ParallelConfig config;
  config.seq_length = 1024;
  return pipeline_layers(model_preset("gpt2-124m"), config);
}

Partition partition_gpt2(std::string_view method, int stages = 4) {
  return partition_layers(gpt2_layers(), stages, parse_partition_method(method), hardware_preset("a100-80g"));
}

double stage_weight(const std::vector<double>& weights, int first, int end) {
  double sum = 0;
  for (int i = first; i < end; ++i) sum += weights[i];
  return sum;
}

// The heaviest and lightest stage of a partition.
std::pair<double, double> extremes(const std::vector<double>& weights, const std::vector<int>& bounds) {
  double heaviest = 0;
  double lightest = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k + 1 < bounds.size(); ++k) {
    const double w = stage_weight(weights, bounds[k], bounds[k + 1]);
    heaviest = std::max(heaviest, w);
    lightest = std::min(lightest, w);
  }
  return {heaviest, lightest};
}

// Every contiguous partition of n layers into p non-empty stages: the best
// (smallest heaviest stage, then largest lightest stage).
std::pair<double, double> brute_force(const std::vector<double>& weights, int p) {
  const int n = static_cast<int>(weights.size());
  std::vector<bool> cut(n - 1, false);
  std::fill(cut.end() - (p - 1), cut.end(), true);
  std::pair<double, double> best = {std::numeric_limits<double>::infinity(), 0};
  do {
    std::vector<int> bounds = {0};
    for (int i = 0; i < n - 1; ++i) {
      if (cut[i]) bounds.push_back(i + 1);
    }
    bounds.push_back(n);
    const auto [heaviest, lightest] = extremes(weights, bounds);
    if (heaviest < best.first || (heaviest == best.first && lightest > best.second)) best = {heaviest, lightest};
  } while (std::next_permutation(cut.begin(), cut.end()));
  return best;
}

TEST(Partition, UniformGivesTheRemainderToTheFirstStagesAsDeepSpeed) {
  EXPECT_EQ(partition_uniform(14, 4), (std::vector<int>{0, 4, 8, 11, 14}));
  EXPECT_EQ(partition_uniform(8, 4), (std::vector<int>{0, 2, 4, 6, 8}));
  EXPECT_EQ(partition_uniform(5, 5), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  const Partition uniform = partition_gpt2("uniform");
  EXPECT_EQ(uniform.stages[0].layer_names, (std::vector<std::string>{"embedding", "block.0", "block.1", "block.2"}));
  EXPECT_EQ(uniform.stages[3].layer_names, (std::vector<std::string>{"block.10", "block.11", "head"}));
}

TEST(Partition, MinMaxEqualsBruteForceOnRandomWeights) {
  std::mt19937 random(20240601);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 2 + static_cast<int>(random() % 11);  // 2..12 layers
    const int p = 1 + static_cast<int>(random() % std::min(n, 5));
    std::vector<double> weights(n);
    // Small integers (exact sums, many ties) in half the trials, reals in the rest.
    for (double& w : weights) w = trial % 2 ? static_cast<double>(random() % 10) : random() / 65536.0;
    const std::vector<int> bounds = partition_min_max(weights, p);
    ASSERT_EQ(bounds.size(), static_cast<std::size_t>(p + 1));
    ASSERT_TRUE(std::is_sorted(bounds.begin(), bounds.end()));
    ASSERT_EQ(std::adjacent_find(bounds.begin(), bounds.end()), bounds.end()) << "empty stage";
    const auto [heaviest, lightest] = extremes(weights, bounds);
    const auto [best_heaviest, best_lightest] = brute_force(weights, p);
    ASSERT_NEAR(heaviest, best_heaviest, 1e-9 * best_heaviest) << "trial " << trial;
    ASSERT_NEAR(lightest, best_lightest, 1e-9 * best_heaviest) << "trial " << trial;
  }
}

// partition_min_max without its shortcuts: every last stage of every state
// in both DPs (O(p · n²)), the same expressions and tie rule otherwise.
std::vector<int> min_max_by_full_dp(const std::vector<double>& weights, int p) {
  const int n = static_cast<int>(weights.size());
  const double infinity = std::numeric_limits<double>::infinity();
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, infinity));
  best[0][0] = 0;
  for (int j = 1; j <= p; ++j) {
    for (int i = j; i <= n - (p - j); ++i) {
      for (int k = j - 1; k < i; ++k) best[j][i] = std::min(best[j][i], std::max(best[j - 1][k], prefix[i] - prefix[k]));
    }
  }
  const double slack = 1e-12 * prefix[n];
  const double cap = best[p][n] + slack;
  std::vector<std::vector<double>> light(p + 1, std::vector<double>(n + 1, -infinity));
  light[0][0] = infinity;
  for (int j = 1; j <= p; ++j) {
    for (int i = j; i <= n; ++i) {
      for (int k = j - 1; k < i; ++k) {
        const double stage = prefix[i] - prefix[k];
        if (stage <= cap) light[j][i] = std::max(light[j][i], std::min(light[j - 1][k], stage));
      }
    }
  }
  const double floor = light[p][n] - slack;
  std::vector<int> bounds(p + 1, 0);
  bounds[p] = n;
  for (int j = p; j >= 1; --j) {
    for (int k = j - 1; k < bounds[j]; ++k) {
      const double stage = prefix[bounds[j]] - prefix[k];
      if (stage <= cap && stage >= floor && light[j - 1][k] >= floor) {
        bounds[j - 1] = k;
        break;
      }
    }
  }
  return bounds;
}

// The DPs look only at stages within a known heaviest stage (uniform's, then
// the optimum's): the cut is the full DP's, boundary for boundary, on
// pipelines as long as the 1T model's (130 layers) and at every stage count.
TEST(Partition, MinMaxEqualsTheFullDpExactly) {
  std::mt19937 random(20261203);
  for (int trial = 0; trial < 60; ++trial) {
    const int n = trial < 30 ? 2 + static_cast<int>(random() % 40) : 130;
    std::vector<double> weights(n);
    // Blocks alike with an odd embedding and head (a model's shape), small
    // integers (ties), or reals.
    for (int i = 0; i < n; ++i) {
      const double block = trial % 3 == 0 ? 7.0 : trial % 3 == 1 ? static_cast<double>(random() % 10)
                                                                  : random() / 65536.0;
      weights[i] = trial % 3 == 0 && (i == 0 || i == n - 1) ? 1.0 + static_cast<double>(random() % 20) : block;
    }
    for (int p = 1; p <= n; p += 1 + static_cast<int>(random() % 7)) {
      ASSERT_EQ(partition_min_max(weights, p), min_max_by_full_dp(weights, p)) << "trial " << trial << " p " << p;
    }
  }
  const auto layers = gpt2_layers();
  for (int p = 1; p <= 14; ++p) {
    const std::vector<double> seconds = layer_seconds(layers, hardware_preset("a100-80g"));
    EXPECT_EQ(partition_min_max(seconds, p), min_max_by_full_dp(seconds, p)) << p;
  }
}

TEST(Partition, MinMaxPutsTiedLayersOnLaterStages) {
  const std::vector<double> equal(6, 1.0);
  EXPECT_EQ(partition_min_max(equal, 3), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(partition_min_max(std::vector<double>{0, 1, 1, 0}, 2), (std::vector<int>{0, 2, 4}));
}

// Per layer (fwd + bwd) a gpt2-124m block costs 72·s·h² + 12·s²·h FLOPs and
// the head 6·s·h·V: V/(12h + 2s) = 4.46 blocks; the embedding costs nothing.
// Uniform's last stage (2 blocks + head) is 6.46 blocks; balanced gives the
// head a stage of its own (4.46) and 4 blocks to each other stage.
TEST(Partition, BalancedStrictlyImprovesTheSlowestStageOverUniformForTheSeedsCase) {
  const Partition uniform = partition_gpt2("uniform");
  const Partition balanced = partition_gpt2("balanced");
  EXPECT_EQ(balanced.boundaries, (std::vector<int>{0, 5, 9, 13, 14}));
  EXPECT_LT(balanced.max_stage_seconds(), uniform.max_stage_seconds());
  const double s = 1024, h = 768, V = 50257;
  const double block = 72 * s * h * h + 12 * s * s * h;
  const double head = 6 * s * h * V;
  EXPECT_DOUBLE_EQ(uniform.stages[3].model_flops, 2 * block + head);
  EXPECT_DOUBLE_EQ(balanced.stages[3].model_flops, head);
  EXPECT_DOUBLE_EQ(balanced.stages[0].model_flops, 4 * block);
  EXPECT_DOUBLE_EQ(uniform.max_stage_seconds() / balanced.max_stage_seconds(), (2 * block + head) / head);
  EXPECT_DOUBLE_EQ(balanced.stages[3].seconds, head / (312e12 * 0.745));  // a100-80g: the GEMM plateau
}

// A real model: llama3-8b (34 layers, untied 128K-vocabulary head) in 4
// stages; brute force tries all C(33, 3) = 5456 cuts. The head weighs 1.7
// blocks, so stages of 8, 8, 9 and 7 blocks + head.
TEST(Partition, BalancedLlamaEqualsBruteForce) {
  ParallelConfig config;
  config.seq_length = 8192;
  config.recompute = Recompute::kSelective;
  const auto layers = pipeline_layers(model_preset("llama3-8b"), config);
  const HardwareProfile h100 = hardware_preset("h100");
  const std::vector<double> seconds = layer_seconds(layers, h100);
  const Partition balanced = partition_layers(layers, 4, parse_partition_method("balanced"), h100);
  const auto [best_heaviest, best_lightest] = brute_force(seconds, 4);
  EXPECT_NEAR(balanced.max_stage_seconds(), best_heaviest, 1e-12 * best_heaviest);
  EXPECT_NEAR(extremes(seconds, balanced.boundaries).second, best_lightest, 1e-12 * best_heaviest);
  EXPECT_EQ(layers.back().tied_owner, -1);  // untied: no copy to count
  EXPECT_EQ(balanced.boundaries, (std::vector<int>{0, 9, 17, 26, 34}));
}

// Per layer: embedding 39.4M, blocks 7.09M, head 38.6M with its tied copy:
// the embedding alone, 6 + 6 blocks, the head alone (heaviest 42.5M).
TEST(Partition, ParametersBalancesParameterCountsWithTheTiedCopy) {
  const Partition partition = partition_gpt2("parameters");
  EXPECT_EQ(partition.boundaries, (std::vector<int>{0, 1, 7, 13, 14}));
  EXPECT_EQ(partition.stages[0].parameters, 50257 * 768 + 1024 * 768);
  EXPECT_EQ(partition.stages[1].parameters, 6 * (12 * 768 * 768 + 13 * 768));
  EXPECT_EQ(partition.stages[3].parameters, 50257 * 768 + 2 * 768);
}

TEST(Partition, TypeRegexBalancesTheMatchingLayersCaseInsensitively) {
  EXPECT_EQ(partition_gpt2("type:BLOCK").boundaries, (std::vector<int>{0, 4, 7, 10, 14}));
  // Only embedding and head match: one of them on each of two stages.
  EXPECT_EQ(partition_gpt2("type:^(embed|head)", 2).boundaries, (std::vector<int>{0, 1, 14}));
  EXPECT_EQ(error_of([] { partition_gpt2("type:mlp"); }),
            "partition type:mlp: matches no layer; layer names are embedding, block.0 ... block.11, head");
  EXPECT_NE(error_of([] { partition_gpt2("type:(("); }).find("partition type:((: not a valid regular expression"),
            std::string::npos);
}

TEST(Partition, ExplicitCountsAndBounds) {
  EXPECT_EQ(partition_gpt2("counts:2,4,4,4").boundaries, (std::vector<int>{0, 2, 6, 10, 14}));
  EXPECT_EQ(partition_gpt2("bounds:0,3,6,10,14").boundaries, (std::vector<int>{0, 3, 6, 10, 14}));
  EXPECT_EQ(partition_gpt2("counts:14", 1).stages[0].layer_names.size(), 14u);
}

TEST(Partition, ErrorsNameTheRuleAndTheFix) {
  EXPECT_EQ(error_of([] { partition_gpt2("uniform", 15); }),
            "15 stages for 14 pipeline layers: every stage needs at least one layer; use at most 14 stages");
  EXPECT_EQ(error_of([] { partition_gpt2("counts:4,4,4,4"); }),
            "partition counts:4,4,4,4: the counts sum to 16 but the model has 14 pipeline layers (embedding, "
            "blocks, head); make them sum to 14");
  // Counts near INT_MAX wrapped to a sum that looked right.
  EXPECT_EQ(error_of([] { partition_gpt2("counts:2147483647,2147483647,2,2"); }),
            "partition counts:2147483647,2147483647,2,2: the counts sum to 4294967298 but the model has 14 pipeline "
            "layers (embedding, blocks, head); make them sum to 14");
  EXPECT_EQ(error_of([] { partition_gpt2("counts:7,7"); }),
            "partition counts:7,7 has 2 stages but the pipeline has 4: give 4 entries");
  EXPECT_EQ(error_of([] { partition_gpt2("counts:0,4,5,5"); }),
            "partition counts:0,4,5,5: every stage needs >= 1 layer (got 0)");
  EXPECT_EQ(error_of([] { partition_gpt2("bounds:0,5,5,10,14"); }),
            "partition bounds:0,5,5,10,14: boundaries must rise strictly from 0 to 14 (the number of pipeline "
            "layers)");
  EXPECT_EQ(error_of([] { partition_gpt2("bounds:0,5,9,14"); }),
            "partition bounds:0,5,9,14 has 3 stages but the pipeline has 4: give 5 entries");
  EXPECT_EQ(error_of([] { parse_partition_method("counts:4,x"); }),
            "partition \"counts:4,x\": \"x\" is not an integer; use uniform, parameters, type:REGEX, balanced, "
            "counts:N,N,... or bounds:0,B,...,LAYERS");
  EXPECT_EQ(error_of([] { parse_partition_method("greedy"); }),
            "unknown partition method \"greedy\": use uniform, parameters, type:REGEX, balanced, counts:N,N,... or "
            "bounds:0,B,...,LAYERS");
  EXPECT_EQ(error_of([] { partition_min_max(std::vector<double>{1, -1}, 1); }),
            "layer weight 1 = -1: weights must be finite and >= 0");
}

TEST(Partition, MethodsPrintAsTheyParse) {
  for (const char* text : {"uniform", "parameters", "type:block", "balanced", "counts:1,2", "bounds:0,1,3"}) {
    EXPECT_EQ(to_string(parse_partition_method(text)), text);
  }
}

}  // namespace
}  // namespace pipeflow
