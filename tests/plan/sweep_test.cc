#include "pipeflow/plan/sweep.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include <fmt/format.h>

#include "../support/error_of.h"
#include "../support/run_key_examples.h"
#include "../trace/xml_check.h"
#include "pipeflow/config/run_keys.h"
#include "pipeflow/core/config.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/prediction.h"

namespace pipeflow {
namespace {

using testing::error_of;

const ConfigSource kConfig = [](const RunOverrides& overrides) {
  return parse_run_config(Config::parse(R"({"model": "gpt2-124m", "hardware": "a100-80g", "seq_length": 1024,
      "train_batch_size": 32, "train_micro_batch_size_per_gpu": 2,
      "pipeline": {"stages": 4, "schedule": "1f1b", "partition_method": "balanced"}})",
                                        "run.json"),
                          overrides);
};

Sweep sweep_of(std::vector<SweepAxis> axes, LrRule rule = LrRule::kSqrt, PointTrainer train = {}) {
  return run_sweep(kConfig, SweepRequest{{}, std::move(axes), rule, std::move(train), {}, {}});
}

TEST(Sweep, EachPointIsTheSimulationOfItsSettingAndMicrobatchesKeepTheGlobalBatch) {
  const Sweep sweep = sweep_of({parse_sweep_axis("microbatches=4,8,16")});
  ASSERT_EQ(sweep.points.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const int m = 4 << i;
    RunOverrides o;
    o.set("train_micro_batch_size_per_gpu", 32 / m);
    const Prediction p = predict(layout_of(resolve(kConfig(o))));
    ASSERT_EQ(p.microbatches, m);
    const SweepPoint& point = sweep.points[i];
    EXPECT_EQ(point.error, "");
    EXPECT_DOUBLE_EQ(point.step_time_s, p.result.step_time_s);
    EXPECT_DOUBLE_EQ(point.bubble_ratio, p.result.bubble_ratio);
    EXPECT_DOUBLE_EQ(point.tokens_per_s, p.tokens_per_s);
  }
  EXPECT_GT(sweep.points[0].bubble_ratio, sweep.points[2].bubble_ratio);  // more micro-batches, less bubble
}

TEST(Sweep, APointThatCannotRunSaysWhyAndTheOthersStillRun) {
  const Sweep sweep = sweep_of({parse_sweep_axis("schedule=1f1b,zbv"), parse_sweep_axis("microbatches=2,8")});
  ASSERT_EQ(sweep.points.size(), 4u);
  EXPECT_EQ(sweep.points[0].setting, (std::vector<std::string>{"1f1b", "2"}));
  EXPECT_NE(sweep.points[0].error.find("1f1b needs microbatches >= stages"), std::string::npos) << sweep.points[0].error;
  EXPECT_EQ(sweep.points[1].error, "");
  EXPECT_NE(sweep.points[2].error, "");  // zbv at v = 1 is refused
}

// Each plotted point of `metric` in `svg` is exactly the JSON's number; the
// points past the noise scale (global batch over it) say so.
void expect_plot_holds_the_json(const std::string& svg, const nlohmann::json& json, const std::string& metric,
                                const std::vector<std::string>& keys) {
  const std::size_t plot = svg.find("data-metric=\"" + metric + "\"");
  ASSERT_NE(plot, std::string::npos) << metric;
  const std::size_t end = svg.find("</g>", plot);
  for (const auto& point : json["points"]) {
    std::string setting;
    for (const std::string& key : keys) {
      if (!setting.empty()) setting += ',';
      setting += point[key].get<std::string>();
    }
    const std::size_t circle = svg.find("data-setting=\"" + setting + "\"", plot);
    ASSERT_LT(circle, end) << metric << " " << setting;
    const std::size_t value = svg.find("data-value=\"", circle) + 12;
    EXPECT_EQ(std::stod(svg.substr(value, svg.find('"', value) - value)), point[metric].get<double>())
        << metric << " " << setting;
    const bool past = json.contains("noise_scale") && point["global_batch"].get<double>() > json["noise_scale"];
    EXPECT_EQ(svg.substr(circle, svg.find("/>", circle) - circle).find("data-past-noise-scale=\"true\"") !=
                  std::string::npos,
              past)
        << metric << " " << setting;
  }
}

TEST(Sweep, ThePlotsAreWellFormedAndHoldTheNumbersOfTheJson) {
  const Sweep sweep =
      sweep_of({parse_sweep_axis("microbatches=4,8,16"), parse_sweep_axis("recompute=none,full")});
  const std::string svg = sweep_svg(sweep);
  EXPECT_EQ(testing::XmlCheck(svg).run(), "");
  const nlohmann::json json = nlohmann::json::parse(sweep_json(sweep));
  ASSERT_EQ(json["points"].size(), 6u);
  for (const char* metric : {"step_time_s", "bubble_ratio", "peak_memory_bytes", "tokens_per_s"}) {
    expect_plot_holds_the_json(svg, json, metric, {"microbatches", "recompute"});
  }
  EXPECT_EQ(svg.find("samples_over_minimum"), std::string::npos);  // no noise scale, no factors
}

// With a noise scale the factors are plotted too, against the first axis,
// a line per value of the second; in every plot the points past B_noise =
// 32 are ringed.
TEST(Sweep, WithANoiseScaleThePlotsHoldTheSamplesAndStepsOverTheMinimum) {
  const SweepRequest request{
      {}, {parse_sweep_axis("global-batch=8,32,128"), parse_sweep_axis("recompute=none,full")}, LrRule::kSqrt, {}, 32.0, {}};
  const Sweep sweep = run_sweep(kConfig, request);
  const std::string svg = sweep_svg(sweep);
  EXPECT_EQ(testing::XmlCheck(svg).run(), "");
  const nlohmann::json json = nlohmann::json::parse(sweep_json(sweep));
  ASSERT_EQ(json["points"].size(), 6u);
  for (const char* metric : {"step_time_s", "bubble_ratio", "peak_memory_bytes", "tokens_per_s",
                             "samples_over_minimum", "steps_over_minimum"}) {
    expect_plot_holds_the_json(svg, json, metric, {"global-batch", "recompute"});
  }
  EXPECT_EQ(json["points"][4]["samples_over_minimum"], 5.0);  // 1 + 128 / 32
  EXPECT_EQ(json["points"][0]["steps_over_minimum"], 5.0);    // 1 + 32 / 8
  // Six plots × two lines × the one batch past 32, each ringed once.
  std::size_t rings = 0;
  for (std::size_t at = svg.find("r=\"6\""); at != std::string::npos; at = svg.find("r=\"6\"", at + 1)) ++rings;
  EXPECT_EQ(rings, 6 * 2 * 1 + 1);  // and the legend's
  EXPECT_NE(svg.find("past the noise scale B_simple = 32 sequences"), std::string::npos);
}

TEST(Sweep, AScheduleMayNameItsVirtualStages) {
  const Sweep sweep = sweep_of({parse_sweep_axis("schedule=1f1b,interleaved-1f1b:2")});
  ASSERT_EQ(sweep.points.size(), 2u);
  EXPECT_EQ(sweep.points[1].error, "");
  RunOverrides o;
  o.set("pipeline.schedule", "interleaved-1f1b");
  o.set("pipeline.virtual_stages", 2);
  EXPECT_DOUBLE_EQ(sweep.points[1].step_time_s, predict(layout_of(resolve(kConfig(o)))).result.step_time_s);
}

// A varied out_dir escaped --out-dir ("../.." wrote at /): the folders are sweep's.
TEST(Sweep, TheFoldersOfTheRunsAreNotVaried) {
  for (const char* axis : {"out_dir=../..,x", "checkpoint.dir=a,b", "checkpoint.load=a,b"}) {
    const std::string key = std::string(axis).substr(0, std::string(axis).find('='));
    EXPECT_EQ(error_of([&] { sweep_of({parse_sweep_axis(axis)}); }),
              "--vary " + key + ": sweep gives every point its own folder under --out-dir and starts it afresh; vary "
              "a setting of the run instead");
  }
}

TEST(Sweep, RejectsAnUnknownKeyAndABadValue) {
  EXPECT_EQ(error_of([] { parse_sweep_axis("1,2"); }),
            "--vary \"1,2\": give KEY=V1,V2,... with KEY one of microbatches, global-batch, micro-batch, zero, fp16, "
            "bf16, stages, partition, schedule, virtual, model, hardware, tensor-parallel, data-parallel, "
            "sequence-parallel, recompute, seq-length, comm, block-launch-overhead or a key path of the run "
            "configuration (pipeline.stages, "
            "optimizer.params.lr, ...)");
  EXPECT_EQ(error_of([] { parse_sweep_axis("stages=2,,4"); }),
            "--vary \"stages=2,,4\": an empty value; separate values by single commas");
  const Sweep sweep = sweep_of({parse_sweep_axis("microbatches=3")});
  EXPECT_EQ(sweep.points[0].error,
            "--vary microbatches=3: the global batch 32 is not a whole number of 3 micro-batches on each of 1 replicas");
}

TEST(Sweep, AVariedGlobalBatchScalesTheLearningRateByTheChosenRule) {
  // The base: 32 sequences at the default lr 1e-3. advise-batch's rules in closed form.
  for (const auto& [rule, factor] : std::vector<std::pair<LrRule, double (*)(double)>>{
           {LrRule::kSqrt, [](double k) { return std::sqrt(k); }},
           {LrRule::kLinear, [](double k) { return k; }},
           {LrRule::kNone, [](double) { return 1.0; }}}) {
    const Sweep sweep = sweep_of({parse_sweep_axis("global-batch=8,32,128")}, rule);
    ASSERT_EQ(sweep.points.size(), 3u);
    EXPECT_EQ(sweep.points[0].lr, 1e-3 * factor(8.0 / 32)) << to_string(rule);
    EXPECT_EQ(sweep.points[1].lr, 1e-3);
    EXPECT_EQ(sweep.points[2].lr, 1e-3 * factor(128.0 / 32)) << to_string(rule);
    EXPECT_NE(sweep_text(sweep).find(fmt::format("{:.4g}", 1e-3 * factor(0.25))), std::string::npos);
  }
  EXPECT_EQ(parse_lr_rule("linear"), LrRule::kLinear);
  EXPECT_EQ(error_of([] { parse_lr_rule("cubic"); }),
            "--lr-rule \"cubic\": use sqrt (Adam, AdamW: advise-batch's rule), linear (SGD's) or none (the configured "
            "rate at every global batch)");
}

// The course's trade-off on one screen: a larger global batch, its bubble,
// memory and learning rate, and past the noise scale the samples it wastes
// (McCandlish et al. 2018: samples / minimum = 1 + B / B_noise, steps /
// minimum = 1 + B_noise / B).
TEST(Sweep, WithANoiseScaleEachGlobalBatchShowsItsSamplesAndStepsOverTheMinimum) {
  SweepRequest request{{}, {parse_sweep_axis("global-batch=8,32,128")}, LrRule::kSqrt, {}, 32.0, {}};
  const Sweep sweep = run_sweep(kConfig, request);
  ASSERT_EQ(sweep.points.size(), 3u);
  const nlohmann::json json = nlohmann::json::parse(sweep_json(sweep));
  EXPECT_EQ(json["noise_scale"], 32.0);
  const double samples[] = {1.25, 2, 5};
  const double steps[] = {5, 2, 1.25};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(sweep.points[i].global_batch, 8 << (2 * i));
    EXPECT_EQ(json["points"][i]["samples_over_minimum"], samples[i]);
    EXPECT_EQ(json["points"][i]["steps_over_minimum"], steps[i]);
  }
  const std::string text = sweep_text(sweep);
  EXPECT_NE(text.find("samples / min"), std::string::npos) << text;
  EXPECT_NE(text.find("5.00 *"), std::string::npos) << text;  // 128 is past B_simple = 32
  EXPECT_EQ(text.find("2.00 *"), std::string::npos) << text;  // 32 is not
  EXPECT_NE(text.find("B_simple = 32 sequences"), std::string::npos) << text;
  EXPECT_EQ(nlohmann::json::parse(sweep_json(sweep_of({parse_sweep_axis("global-batch=8")}))).count("noise_scale"), 0u);
  request.noise_scale = 0.0;
  EXPECT_EQ(error_of([&] { run_sweep(kConfig, request); }),
            "--noise-scale 0: must be a positive number of sequences (B_simple)");
}

TEST(Sweep, TheRuleScalesTheWarmupsTargetWhenTheSchedulerHasOne) {
  const ConfigSource warmup = [](const RunOverrides& overrides) {
    return parse_run_config(Config::parse(R"({"model": "gpt2-124m", "hardware": "a100-80g", "seq_length": 1024,
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "optimizer": {"params": {"lr": 5}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 4e-4, "warmup_num_steps": 10}},
        "pipeline": {"stages": 2}})",
                                          "run.json"),
                            overrides);
  };
  const Sweep sweep = run_sweep(warmup, SweepRequest{{}, {parse_sweep_axis("global-batch=64")}, LrRule::kLinear, {}, {}, {}});
  EXPECT_EQ(sweep.points[0].error, "");
  EXPECT_EQ(sweep.points[0].lr, 4e-4 * 4);
}

TEST(Sweep, AKeyPathVariesThatKeyOfTheConfiguration) {
  const Sweep by_path = sweep_of({parse_sweep_axis("pipeline.stages=2,4"), parse_sweep_axis("optimizer.params.lr=0.5")});
  const Sweep by_option = sweep_of({parse_sweep_axis("stages=2,4")});
  ASSERT_EQ(by_path.points.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(by_path.points[i].error, "");
    EXPECT_EQ(by_path.points[i].step_time_s, by_option.points[i].step_time_s);
    EXPECT_EQ(by_path.points[i].peak_memory_bytes, by_option.points[i].peak_memory_bytes);
    EXPECT_EQ(by_path.points[i].lr, 0.5);
  }
  RunOverrides four;
  four.set("pipeline.stages", 4);
  EXPECT_EQ(by_path.points[1].step_time_s, predict(layout_of(resolve(kConfig(four)))).result.step_time_s);

  // An inline model's shape; a string value.
  const ConfigSource inline_model = [](const RunOverrides& overrides) {
    return parse_run_config(Config::parse(R"({"model": {"n_layer": 4, "n_head": 4, "n_embd": 64, "n_ctx": 32},
        "train_batch_size": 8, "pipeline": {"stages": 2}})",
                                          "run.json"),
                            overrides);
  };
  const Sweep layers = run_sweep(
      inline_model, SweepRequest{{}, {parse_sweep_axis("model.n_layer=2,8"), parse_sweep_axis("pipeline.schedule=gpipe")},
                                 LrRule::kSqrt, {}, {}, {}});
  ASSERT_EQ(layers.points.size(), 2u);
  const RunConfig eight = parse_run_config(Config::parse(R"({"model": {"n_layer": 8, "n_head": 4, "n_embd": 64,
      "n_ctx": 32}, "train_batch_size": 8, "pipeline": {"stages": 2, "schedule": "gpipe"}})",
                                                         "run.json"));
  EXPECT_EQ(layers.points[1].error, "");
  EXPECT_EQ(layers.points[1].step_time_s, predict(layout_of(resolve(eight))).result.step_time_s);
  EXPECT_LT(layers.points[0].step_time_s, layers.points[1].step_time_s);
}

// Values split at commas outside JSON brackets and strings: a preset beside
// an inline model, lists, and an object whose string holds "," and "}".
TEST(Sweep, AValueMayBeAJsonObjectOrListWithCommasInside) {
  const SweepAxis models =
      parse_sweep_axis(R"(model=gpt-tiny,{"n_layer": 2, "n_head": 2, "n_embd": 64, "n_ctx": 32, "vocab_size": 256})");
  EXPECT_EQ(models.values, (std::vector<std::string>{
                               "gpt-tiny", R"({"n_layer": 2, "n_head": 2, "n_embd": 64, "n_ctx": 32, "vocab_size": 256})"}));
  const Sweep sweep = sweep_of({models, parse_sweep_axis("seq-length=32")});
  ASSERT_EQ(sweep.points.size(), 2u);
  EXPECT_EQ(sweep.points[0].error, "");
  EXPECT_EQ(sweep.points[1].error, "");
  EXPECT_LT(sweep.points[1].step_time_s, sweep.points[0].step_time_s);  // 2 layers of 64 against gpt-tiny
  EXPECT_EQ(parse_sweep_axis("variable-seq-lengths=[8,16],[32]").values,
            (std::vector<std::string>{"[8,16]", "[32]"}));
  EXPECT_EQ(parse_sweep_axis(R"(x={"a": "},\",[", "b": [1, {"c": 2}]},3)").values,
            (std::vector<std::string>{R"({"a": "},\",[", "b": [1, {"c": 2}]})", "3"}));
  EXPECT_EQ(parse_sweep_axis(R"(x={"open": 1, "b": 2)").values, (std::vector<std::string>{R"({"open": 1, "b": 2)"}));
}

TEST(Sweep, AnUnknownKeyIsAnErrorNamingItAndListingTheValidOnes) {
  const std::string error = error_of([] { sweep_of({parse_sweep_axis("pipeline.speed=1,2")}); });
  EXPECT_EQ(error.rfind("--vary \"pipeline.speed\": neither an option (microbatches, global-batch, "
                        "micro-batch, zero, fp16, bf16, stages, partition, schedule, virtual, model, hardware, tensor-parallel, "
                        "data-parallel, sequence-parallel, recompute, seq-length, comm, block-launch-overhead) nor a key "
                        "path of run.json (",
                        0),
            0u)
      << error;
  for (const char* key : {"optimizer.params.lr", "pipeline.stages", "steps", "train_batch_size",
                          "gradient_accumulation_steps", "pipeline.activation_checkpoint_interval"}) {
    EXPECT_NE(error.find(std::string(key) + ","), std::string::npos) << key << " in " << error;
  }
  // A key path whose value the configuration refuses: that point says why.
  const Sweep sweep = sweep_of({parse_sweep_axis("pipeline.stages=0,2")});
  EXPECT_EQ(sweep.points[0].error, "run.json: pipeline.stages = 0: must be a positive integer: the number of pipeline ranks");
  EXPECT_EQ(sweep.points[1].error, "");
}

// A stand-in for pipeflow train whose figures are closed forms of the run.
MeasuredPoint fake_training(const ResolvedRun& run, const std::string& name, std::vector<std::string>& names) {
  names.push_back(name);
  const double tokens = static_cast<double>(run.batch.global) * run.seq_length;
  MeasuredPoint m;
  m.step_time_s = 0.001 * run.batch.global;
  m.bubble_ratio = 0.25;
  m.peak_activation_bytes = 1000.0 * run.batch.micro;
  m.tokens_per_s = tokens / m.step_time_s;
  m.tokens_seen = {tokens, 2 * tokens, 3 * tokens};
  m.loss = {5.5, 5.0 - run.config.optimizer.lr, 4.5};
  m.val_loss = 4.75;
  m.out_dir = "runs/" + name;
  return m;
}

TEST(Sweep, ATrainedSweepTrainsEachPointAndDrawsMeasuredBesidePredictedAndTheLossCurves) {
  std::vector<std::string> names;
  const Sweep sweep = sweep_of({parse_sweep_axis("global-batch=16,64"), parse_sweep_axis("schedule=1f1b,gpipe")},
                              LrRule::kSqrt,
                              [&](const ResolvedRun& run, const std::string& name) {
                                return fake_training(run, name, names);
                              });
  EXPECT_EQ(names, (std::vector<std::string>{"global-batch=16,schedule=1f1b", "global-batch=16,schedule=gpipe",
                                             "global-batch=64,schedule=1f1b", "global-batch=64,schedule=gpipe"}));
  ASSERT_TRUE(sweep.points[3].measured);
  EXPECT_EQ(sweep.points[3].measured->loss[1], 5.0 - 1e-3 * std::sqrt(2.0));  // trained at the rule's lr
  const std::string text = sweep_text(sweep);
  EXPECT_EQ(text.rfind("global-batch  schedule         lr  step time pred / meas  bubble pred / meas", 0), 0u) << text;
  EXPECT_NE(text.find("/ 16.0 ms"), std::string::npos) << text;

  const std::string svg = sweep_svg(sweep);
  EXPECT_EQ(testing::XmlCheck(svg).run(), "");
  const nlohmann::json json = nlohmann::json::parse(sweep_json(sweep));
  EXPECT_TRUE(json["trained"].get<bool>());
  // The value of the circle of `setting` and `series` in plot `metric` after `from`.
  const auto circle_value = [&](const std::string& metric, const std::string& setting, const std::string& series,
                                std::size_t& from) {
    const std::size_t plot = svg.find("data-metric=\"" + metric + "\"");
    const std::size_t end = svg.find("</g>", plot);
    from = svg.find("data-setting=\"" + setting + "\" data-series=\"" + series + "\"", std::max(from, plot));
    EXPECT_LT(from, end) << metric << " " << setting << " " << series;
    const std::size_t value = svg.find("data-value=\"", from) + 12;
    return std::stod(svg.substr(value, svg.find('"', value) - value));
  };
  for (const char* metric : {"step_time_s", "bubble_ratio", "peak_activation_bytes", "tokens_per_s"}) {
    for (const auto& point : json["points"]) {
      const std::string setting = point["global-batch"].get<std::string>() + "," + point["schedule"].get<std::string>();
      std::size_t from = 0;
      EXPECT_EQ(circle_value(metric, setting, "predicted", from), point[metric].get<double>());
      from = 0;
      EXPECT_EQ(circle_value(metric, setting, "measured", from), point["measured"][metric].get<double>());
    }
  }
  for (const auto& point : json["points"]) {
    const std::string setting = point["global-batch"].get<std::string>() + "," + point["schedule"].get<std::string>();
    std::size_t from = 0;
    for (std::size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(circle_value("loss", setting, "measured", from), point["measured"]["loss"][s].get<double>());
      const std::size_t tokens = svg.find("data-tokens=\"", from) + 13;
      EXPECT_EQ(std::stod(svg.substr(tokens, svg.find('"', tokens) - tokens)),
                point["measured"]["tokens_seen"][s].get<double>());
      ++from;
    }
  }
}

// Every key run_keys() lets sweep vary is an option named by its flag (and
// its aliases) whose values reach the point's configuration as the key.
TEST(Sweep, EveryKeyTheTableLetsVaryIsAnOptionThatSetsTheKey) {
  int varied = 0;
  for (const auto& example : testing::run_key_examples()) {
    const RunKey& key = *find_run_key(example.path);
    if (!key.vary) continue;
    ++varied;
    for (const std::string& name : {std::string(key.flag.substr(2)), std::string(key.aliases)}) {
      if (name.empty() || name.find(',') != std::string::npos) continue;
      const std::string option = name.starts_with("--") ? name.substr(2) : name;
      SCOPED_TRACE(option);
      RunOverrides seen;
      const ConfigSource capture = [&](const RunOverrides& overrides) {
        seen = overrides;
        return kConfig(overrides);
      };
      run_sweep(capture, SweepRequest{{}, {parse_sweep_axis(option + "=" + testing::as_typed(example.value))}, LrRule::kNone, {}, {}, {}});
      ASSERT_NE(seen.find(example.path), nullptr);
      EXPECT_EQ(*seen.find(example.path), example.value);
    }
  }
  EXPECT_EQ(varied, 18);  // and microbatches, derived
}

}  // namespace
}  // namespace pipeflow
