// Tensor parallelism (Megatron-LM's scheme) in threads: every layout of
// t tensor-parallel × p pipeline × d data-parallel ranks trains to the losses,
// gradients and weights of the unpipelined run; a checkpoint holds whole
// tensors, so a run saved at one tensor-parallel size resumes at another.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "pipeflow/nn/parameter_layout.h"
#include "pipeflow/runtime/batch_source.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "pipeflow/runtime/engine.h"
#include "pipeflow/schedule/generators.h"
#include "engine/tensor_collectives.h"
#include "pipeflow/runtime/rank_group.h"
#include "pipeflow/tensor/gemm.h"
#include "test_support.h"
#include "../support/temp_dir.h"

namespace pipeflow::runtime {
namespace {

using testing::error_of;
using testing::Reference;

// --- Which part of each tensor a rank holds ---

TEST(TensorSlice, AFusedQkvGivesEachRankItsHeadsOfQAndOfKAndOfV) {
  const nn::ModelConfig model{.vocab_size = 8, .context = 4, .n_layer = 1, .n_head = 2, .n_embd = 4};
  const nn::ParameterLayout layout(model, {1, 2}, {.size = 2, .rank = 1});
  const nn::ParameterInfo& qkv = layout.at("h.0.attn.c_attn.weight");  // [C, 3C] = [4, 12] in Conv1D layout
  EXPECT_EQ(qkv.shape, (Shape{4, 6}));
  EXPECT_EQ(qkv.whole, (Shape{4, 12}));
  std::vector<float> whole(48);
  for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(i);
  std::vector<float> part(24);
  nn::copy_part<float>(qkv, whole, part);
  // Row 0: q's columns 2, 3, k's 6, 7, v's 10, 11; row 1 starts at 12.
  EXPECT_EQ(std::vector<float>(part.begin(), part.begin() + 8), (std::vector<float>{2, 3, 6, 7, 10, 11, 14, 15}));
  std::vector<float> back(48, -1);
  nn::place_part<float>(qkv, part, back);
  for (std::size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i], i % 4 >= 2 ? whole[i] : -1.0f) << i;  // its columns, and nothing else
  }
  // Row-parallel: rows; replicated: whole.
  EXPECT_EQ(layout.at("h.0.attn.c_proj.weight").shape, (Shape{2, 4}));
  EXPECT_EQ(layout.at("h.0.mlp.c_fc.bias").shape, (Shape{8}));
  EXPECT_EQ(layout.at("h.0.attn.c_proj.bias").shape, (Shape{4}));
  EXPECT_FALSE(layout.at("h.0.ln_1.weight").split());
}

TEST(TensorSlice, AModelThatDoesNotDivideIsRefusedNamingTheField) {
  EXPECT_EQ(error_of([] { nn::validate_tensor_parallel(testing::kTiny, 4); }),
            "tensor_parallel = 4: the model's n_head (num_attention_heads: each rank computes whole heads) = 2 is not "
            "a multiple of it: this model splits over tensor_parallel 1, 2");
  EXPECT_EQ(error_of([] { nn::validate_tensor_parallel(testing::kTinyLlama, 4); }),
            "tensor_parallel = 4: the model's n_kv_head (num_key_value_heads: each rank holds its own key/value "
            "heads) = 2 is not a multiple of it: this model splits over tensor_parallel 1, 2");
}

// --- Training ---

struct Layout {
  int tensor = 1;
  int stages = 1;
  int data_parallel = 1;
  std::string schedule = "1f1b";
  bool zero1 = false;
  bool sequence = false;
  int recompute_interval = 0;
};

std::string describe(const Layout& l, const nn::ModelConfig& model) {
  return fmt::format("{} tp {} x pp {} x dp {} {}{}{}{}", nn::to_string(model.family), l.tensor, l.stages,
                     l.data_parallel, l.schedule, l.zero1 ? " ZeRO-1" : "", l.sequence ? " sequence-parallel" : "",
                     l.recompute_interval > 0 ? " recompute" : "");
}

// Five steps of the layout equal the unpipelined run on the same global
// batch: the losses, the gradients of the first step (gathered whole) and
// the weights after the last.
void expect_equals_unpipelined(const Layout& l, const nn::ModelConfig& model) {
  const int virtual_stages = l.schedule == "interleaved-1f1b" || l.schedule == "zbv" ? 2 : 1;
  const int microbatches = l.schedule == "1f1b" ? std::max(2, l.stages) : 2 * l.stages;
  const Schedule schedule = make_schedule(l.schedule, l.stages, microbatches, virtual_stages);
  EngineOptions options = testing::tiny_options();
  options.data_parallel = l.data_parallel;
  options.tensor_parallel = l.tensor;
  options.shard_optimizer = l.zero1;
  options.sequence_parallel = l.sequence;
  options.recompute_interval = l.recompute_interval;
  PipelineEngine engine(model, schedule, partition_uniform(model.pipeline_layers(), schedule.num_stages()), options);
  engine.init_parameters(11);
  const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
  Reference unpipelined(microbatches * l.data_parallel * testing::kMicroBatch, 11, model);
  const std::string what = describe(l, model);
  // Step 0's gradients alone, then three steps that update.
  engine.step(0, source, StepMode::kGradientsOnly);
  unpipelined.step(0, false);
  const auto gradients = engine.assemble_model(true);
  ASSERT_NE(gradients, nullptr);
  // (Under ZeRO-1 a replica keeps only its part of the summed gradients.)
  for (const nn::ParameterInfo& info : l.zero1 ? std::vector<nn::ParameterInfo>{} : gradients->layout().entries()) {
    EXPECT_LT(testing::relative_error(gradients->gradient(info.name), unpipelined.model().gradient(info.name)), 1e-5)
        << what << ": gradient of " << info.name;
  }
  for (int step = 0; step < 5; ++step) {
    const StepResult result = engine.step(step, source);
    const double reference = unpipelined.step(step, true);
    EXPECT_NEAR(result.loss, reference, 1e-5 * reference) << what << ", step " << step;
    EXPECT_EQ(result.microbatch_losses.size(), static_cast<std::size_t>(microbatches * l.data_parallel)) << what;
    if (l.tensor > 1 && step == 4) {
      // Every rank's record holds its tensor-parallel all-reduces: 2 a block in F, 2 in I (fewer on no stage).
      for (const RankRecord& record : result.ranks) EXPECT_GE(record.collectives.size(), 4U) << what;
    }
  }
  const auto model_after = engine.assemble_model();
  ASSERT_NE(model_after, nullptr);
  EXPECT_LT(testing::relative_error(model_after->parameters(), unpipelined.model().parameters()), 1e-5) << what;
}

TEST(TensorParallelInThreads, GptTwoTrainsAsTheUnpipelinedRunInEveryLayoutOfUpToEightRanks) {
  for (const Layout& l : {Layout{.tensor = 2}, Layout{.tensor = 2, .stages = 2},
                          Layout{.tensor = 2, .stages = 2, .data_parallel = 2},
                          Layout{.tensor = 2, .data_parallel = 2, .zero1 = true},
                          Layout{.tensor = 2, .stages = 2, .schedule = "interleaved-1f1b"},
                          Layout{.tensor = 2, .stages = 2, .schedule = "zbv"}}) {
    expect_equals_unpipelined(l, testing::kTiny);
  }
}

TEST(TensorParallelInThreads, FourTensorParallelRanksTrainAsTheUnpipelinedRun) {
  nn::ModelConfig four_heads = testing::kTiny;
  four_heads.n_head = 4;
  for (const Layout& l : {Layout{.tensor = 4, .stages = 2, .schedule = "zbv"},
                          Layout{.tensor = 4, .data_parallel = 2, .zero1 = true}}) {
    expect_equals_unpipelined(l, four_heads);
  }
}

// Sequence parallelism beside tensor parallelism: the activations between
// layers and stages split along the sequence, every layout still the
// unpipelined run's losses, gradients and weights.
TEST(TensorParallelInThreads, SequenceParallelLayoutsTrainAsTheUnpipelinedRun) {
  nn::ModelConfig four_heads = testing::kTiny;
  four_heads.n_head = 4;
  for (const Layout& l : {Layout{.tensor = 2, .sequence = true}, Layout{.tensor = 2, .stages = 2, .sequence = true},
                          Layout{.tensor = 2, .stages = 2, .schedule = "zbv", .sequence = true},
                          Layout{.tensor = 2, .stages = 2, .schedule = "interleaved-1f1b", .sequence = true,
                                 .recompute_interval = 1},
                          Layout{.tensor = 2, .data_parallel = 2, .zero1 = true, .sequence = true}}) {
    expect_equals_unpipelined(l, testing::kTiny);
    expect_equals_unpipelined(l, testing::kTinyLlama);
  }
  expect_equals_unpipelined(Layout{.tensor = 4, .stages = 2, .sequence = true}, four_heads);
}

// Every layout of t ≥ 2 tensor-parallel × p × d ranks up to 8 that the model
// divides, for 1F1B, interleaved 1F1B and ZB-V, with and without sequence
// parallelism (and ZeRO-1 where d > 1): GPT-2 of 4 heads, Llama of 4 heads
// on 2 key/value heads (t = 2 only).
TEST(TensorParallelInThreads, EveryLayoutOfUpToEightRanksTrainsAsTheUnpipelinedRun) {
  nn::ModelConfig gpt = testing::kTiny;
  gpt.n_head = 4;
  int layouts = 0;
  for (const nn::ModelConfig* model : {static_cast<const nn::ModelConfig*>(&gpt), &testing::kTinyLlama}) {
    for (const int t : {2, 4}) {
      if (model->kv_heads() % t != 0) continue;
      for (const int p : {1, 2, 4}) {
        for (const int d : {1, 2}) {
          if (t * p * d > 8) continue;
          for (const std::string schedule : {"1f1b", "interleaved-1f1b", "zbv"}) {
            if (schedule != "1f1b" && p == 4) continue;  // 8 stages of the 8 pipeline layers: covered at p = 2
            for (const bool sequence : {false, true}) {
              // Under a sanitizer, every fifth layout: 5 is prime to the 6
              // (schedule, sequence) pairs of a (t, p, d), so the kept ones
              // still take each schedule with and without sequence parallelism.
              if (!testing::kSanitized || layouts % 5 == 0) {
                expect_equals_unpipelined(
                    {.tensor = t, .stages = p, .data_parallel = d, .schedule = schedule, .zero1 = d > 1,
                     .sequence = sequence},
                    *model);
              }
              ++layouts;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(layouts, 70);  // GPT-2: 8 (t, p, d) x 3 schedules (1F1B alone at p = 4) x 2; Llama: 5 of them at t = 2
}

TEST(TensorParallelInThreads, LlamaTrainsAsTheUnpipelinedRunWithItsKeyValueHeadsSplit) {
  for (const Layout& l : {Layout{.tensor = 2}, Layout{.tensor = 2, .stages = 2, .schedule = "zbv"},
                          Layout{.tensor = 2, .stages = 2, .data_parallel = 2, .zero1 = true}}) {
    expect_equals_unpipelined(l, testing::kTinyLlama);
  }
}

TEST(TensorParallelInThreads, ACheckpointHoldsWholeTensorsAndResumesAtAnotherSize) {
  const std::filesystem::path dir = pipeflow::testing::make_temp_dir();
  const nn::ModelConfig model = testing::kTinyLlama;  // 4 heads on 2 key/value heads: splits in 2, not 4
  const nn::ModelConfig gpt = testing::kTiny;
  const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
  for (const nn::ModelConfig& m : {model, gpt}) {
    EngineOptions options = testing::tiny_options();
    options.tensor_parallel = 2;
    const Schedule schedule = make_schedule("1f1b", 2, 2, 1);
    PipelineEngine split(m, schedule, partition_uniform(m.pipeline_layers(), 2), options);
    split.init_parameters(11);
    for (int step = 0; step < 2; ++step) split.step(step, source);
    split.write_checkpoint(dir / "checkpoint.safetensors", 2);
    const nn::SafetensorsFile file = read_checkpoint(dir / "checkpoint.safetensors");
    EXPECT_EQ(file.entry(std::string("exp_avg.") + m.embedding_name()).shape,
              (Shape{m.vocab_size, m.n_embd}));
    const auto written = split.assemble_model();
    for (const int tensor : {1, 2}) {
      EngineOptions resumed_options = testing::tiny_options();
      resumed_options.tensor_parallel = tensor;
      PipelineEngine resumed(m, make_schedule("1f1b", 1, 2, 1), partition_uniform(m.pipeline_layers(), 1),
                             resumed_options);
      EXPECT_EQ(resumed.load_checkpoint(file), 2);
      const auto loaded = resumed.assemble_model();
      EXPECT_EQ(std::vector<float>(written->parameters().begin(), written->parameters().end()),
                std::vector<float>(loaded->parameters().begin(), loaded->parameters().end()))
          << nn::to_string(m.family) << " resumed at tensor_parallel " << tensor;
      // The moments came back too: the next step equals the split run's next step.
      const double next = resumed.step(2, source).loss;
      EXPECT_NEAR(next, split.step(2, source).loss, 1e-5 * next) << nn::to_string(m.family) << " tp " << tensor;
      // Put the split run back where it was for the next size.
      split.load_checkpoint(file);
    }
  }
}

TEST(TensorParallelInThreads, AGptTwoCheckpointOfTwoRanksResumesAtFour) {
  const std::filesystem::path dir = pipeflow::testing::make_temp_dir();
  const nn::ModelConfig model{.vocab_size = 256, .context = 16, .n_layer = 2, .n_head = 4, .n_embd = 32};
  const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
  EngineOptions options = testing::tiny_options();
  options.tensor_parallel = 2;
  PipelineEngine two(model, make_schedule("1f1b", 1, 2, 1), partition_uniform(model.pipeline_layers(), 1), options);
  two.init_parameters(5);
  two.step(0, source);
  two.write_checkpoint(dir / "checkpoint.safetensors", 1);
  options.tensor_parallel = 4;
  PipelineEngine four(model, make_schedule("1f1b", 1, 2, 1), partition_uniform(model.pipeline_layers(), 1), options);
  four.load_checkpoint(read_checkpoint(dir / "checkpoint.safetensors"));
  const double at_four = four.step(1, source).loss;
  EXPECT_NEAR(at_four, two.step(1, source).loss, 1e-5 * at_four);
}

// Megatron's other rank order (--use-tp-pp-dp-mapping) in threads: the
// same run.
TEST(TensorParallelInThreads, TheTensorPipelineDataOrderTrainsAsTheUnpipelinedRun) {
  const auto group = RankGroup::in_threads(
      {.pipeline = 2, .data_parallel = 2, .tensor = 2, .order = RankOrder::kTensorPipelineData});
  const Schedule schedule = make_schedule("1f1b", 2, 2, 1);
  PipelineEngine engine(testing::kTiny, schedule, partition_uniform(testing::kTiny.pipeline_layers(), 2),
                        testing::tiny_options(), *group);
  engine.init_parameters(11);
  const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
  Reference unpipelined(2 * 2 * testing::kMicroBatch);
  for (int step = 0; step < 3; ++step) {
    const double loss = engine.step(step, source).loss;
    EXPECT_NEAR(loss, unpipelined.step(step, true), 1e-5 * loss) << step;
  }
}

// A stage's parameters as a rank holds them (the profile's model-state
// bytes and the memory the simulator re-walks): its tensor-parallel part.
TEST(TensorParallelInThreads, AStagesParameterCountIsOneRanksPart) {
  EngineOptions options = testing::tiny_options();
  options.tensor_parallel = 2;
  PipelineEngine engine(testing::kTiny, make_schedule("1f1b", 2, 2, 1),
                        partition_uniform(testing::kTiny.pipeline_layers(), 2), options);
  const nn::LayerRange first{0, testing::kTiny.pipeline_layers() / 2};
  EXPECT_EQ(engine.stage_parameter_count(StageId(0)),
            nn::ParameterLayout(testing::kTiny, first, {.size = 2, .rank = 1}).total());
  EXPECT_LT(engine.stage_parameter_count(StageId(0)), nn::ParameterLayout(testing::kTiny, first).total() * 6 / 10);
}

TEST(TensorParallelInThreads, ALayoutThatTheModelDoesNotDivideIsRefusedBeforeAnyStep) {
  EngineOptions options = testing::tiny_options();
  options.tensor_parallel = 4;  // kTiny has 2 heads
  EXPECT_NE(error_of([&] {
              PipelineEngine engine(testing::kTiny, make_schedule("1f1b", 1, 2, 1),
                                    partition_uniform(testing::kTiny.pipeline_layers(), 1), options);
            }).find("tensor_parallel = 4: the model's n_head"),
            std::string::npos);
}

// The zero-bubble contract on tensor-parallel ranks (the stage alone,
// without the engine): on each of 2 ranks, I for two micro-batches, then W
// for both, gives bit for bit the gradients B gives micro-batch after
// micro-batch, in bf16 (I stashes and W is lent the rank's parts, and with
// sequence parallelism the gathered and scattered sequences) and in fp32;
// GPT-2 and Llama, with and without sequence parallelism.
TEST(TensorParallelInThreads, InputThenWeightPassesEqualTheFullBackwardBitForBit) {
  constexpr int kB = 2, kT = 8;
  const auto batch = [](const nn::ModelConfig& model, std::uint32_t seed) {
    nn::StageInput input{.tokens = IntTensor(Shape{kB, kT}), .targets = IntTensor(Shape{kB, kT})};
    for (std::int64_t i = 0; i < kB * kT; ++i) {
      input.tokens[i] = static_cast<std::int32_t>((seed * 31 + i * 7) % model.vocab_size);
      input.targets[i] = static_cast<std::int32_t>((seed * 17 + i * 13 + 5) % model.vocab_size);
    }
    return input;
  };
  // One bf16 product on this thread before the ranks start: oneDNN sets up
  // its matmul machinery once, in whichever thread asks first, and publishes
  // it through its own (uninstrumented) atomics, which ThreadSanitizer
  // reports as a race when two ranks ask at once; done here, the threads'
  // start orders it.
  if (bf16_matmul_available()) {
    const GemmPrecisionScope bf16(GemmPrecision::kBf16);
    const std::array<float, 4> a{1, 2, 3, 4};
    std::array<float, 4> c{};
    gemm<float>(Transpose::kNo, Transpose::kNo, 2, 2, 2, 1.0f, a.data(), 2, a.data(), 2, 0.0f, c.data(), 2);
    ASSERT_EQ(c[0], 7.0f);  // 1·1 + 2·3, exact in bf16
    gemm_bias(2, 2, 2, a.data(), 2, a.data(), 2, a.data(), c.data(), 2);  // and one with a bias, as qkv's
    ASSERT_EQ(c[0], 8.0f);
  }
  for (const nn::ModelConfig* model : {&testing::kTiny, &testing::kTinyLlama}) {
    for (const bool sequence : {false, true}) {
      for (const ComputeFormat format : {ComputeFormat::kFp32, ComputeFormat::kBf16}) {
        const std::string what = fmt::format("{}{} {}", nn::to_string(model->family),
                                             sequence ? " sequence-parallel" : "", to_string(format));
        const auto group = RankGroup::in_threads({.pipeline = 1, .data_parallel = 1, .tensor = 2});
        std::array<bool, 2> equal{};  // one element a rank
        group->run(
            [&](int w) {
              TensorCollectives collectives(group->tensor(w), std::chrono::seconds(60));
              const nn::StageOptions options{.format = format, .tensor = &collectives, .sequence_parallel = sequence};
              nn::Stage split(*model, nn::all_layers(*model), options);
              nn::Stage full(*model, nn::all_layers(*model), options);
              split.init_parameters(5);
              full.init_parameters(5);
              nn::MicrobatchState first, second, state;
              split.forward(first, batch(*model, 1));
              split.forward(second, batch(*model, 2));
              split.backward_input_from_loss(first, 0.5);
              split.backward_input_from_loss(second, 0.5);
              split.backward_weight(first);
              split.backward_weight(second);
              full.forward(state, batch(*model, 1));
              full.backward_from_loss(state, 0.5);
              full.forward(state, batch(*model, 2));
              full.backward_from_loss(state, 0.5);
              const auto a = split.gradients();
              const auto b = full.gradients();
              equal[w] = !a.empty() && a.size() == b.size() &&
                         std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
            },
            [] {});
        EXPECT_TRUE(equal[0] && equal[1]) << what;
      }
    }
  }
}

// A rank that never joins a layer's collective: its peer's wait ends at the
// deadline naming the collective, the group and the rank that never came.
TEST(TensorParallelInThreads, AWaitForAPeerInALayersCollectiveTimesOutNamingItAndThePeer) {
  const auto group = RankGroup::in_threads({.pipeline = 1, .data_parallel = 1, .tensor = 2});
  const std::string error = error_of([&] {
    group->run(
        [&](int w) {
          if (w != 0) return;
          TensorCollectives collectives(group->tensor(0), std::chrono::milliseconds(200));
          std::vector<float> values(8, 1.0f);
          collectives.all_reduce_sum(values, "the tensor-parallel all-reduce of the MLP's output");
        },
        [] {});
  });
  EXPECT_NE(error.find("timed out after 0 s waiting for the tensor-parallel all-reduce of the MLP's output in the "
                       "tensor-parallel group of pipeline rank 0, data-parallel rank 0: world rank 1 never came"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace pipeflow::runtime
