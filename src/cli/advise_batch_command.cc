// `pipeflow advise-batch`: the learning rate and warmup for another global
// batch, by the rule that fits the optimizer, and the critical batch size.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/plan/advise_batch.h"

namespace pipeflow::cli {
namespace {

struct AdviseBatchCommand {
  long long base_batch = 0;
  double base_lr = 0;
  long long base_warmup = 0;
  long long target_batch = 0;
  std::string optimizer = "adam";
  std::optional<double> noise_scale;
  std::string metrics;
  bool json = false;
};

void run(AdviseBatchCommand c) {
  if (!c.metrics.empty()) {
    if (c.noise_scale) fail("--noise-scale and --metrics {}: give the noise scale one way", c.metrics);
    c.noise_scale = noise_scale_of_metrics(c.metrics);
  }
  const BatchAdvice advice = advise_batch({.base_batch = c.base_batch,
                                           .base_lr = c.base_lr,
                                           .base_warmup_steps = c.base_warmup,
                                           .target_batch = c.target_batch,
                                           .optimizer = parse_optimizer_family(c.optimizer),
                                           .noise_scale = c.noise_scale});
  if (c.json) {
    nlohmann::ordered_json json;
    json["base_batch"] = c.base_batch;
    json["target_batch"] = c.target_batch;
    json["scale"] = advice.scale;
    json["lr"] = advice.lr;
    json["warmup_steps"] = advice.warmup_steps;
    json["rule"] = advice.rule;
    json["why"] = advice.why;
    if (c.noise_scale) json["noise_scale"] = *c.noise_scale;
    if (advice.steps_over_minimum) json["steps_over_minimum"] = *advice.steps_over_minimum;
    if (advice.samples_over_minimum) json["samples_over_minimum"] = *advice.samples_over_minimum;
    json["warnings"] = advice.warnings;
    write_output(json_text(json, 2) + "\n", "");
    return;
  }
  std::string out = fmt::format("batch {} -> {} ({:.3g}x): learning rate {:.4g} -> {:.4g}, warmup {} -> {} steps\n",
                                c.base_batch, c.target_batch, advice.scale, c.base_lr, advice.lr, c.base_warmup,
                                advice.warmup_steps);
  out += fmt::format("rule: {}\nwhy: {}\n", advice.rule, advice.why);
  if (advice.samples_over_minimum) {
    out += fmt::format(
        "at the target: {:.2f}x the minimum steps, {:.2f}x the minimum samples (McCandlish et al. 2018)\n",
        *advice.steps_over_minimum, *advice.samples_over_minimum);
  }
  for (const std::string& warning : advice.warnings) out += "warning: " + warning + "\n";
  write_output(out, "");
}

}  // namespace

void add_advise_batch_command(CLI::App& app) {
  auto c = std::make_shared<AdviseBatchCommand>();
  CLI::App* sub = app.add_subcommand(
      "advise-batch", "Learning rate and warmup for another global batch, and whether it is past the critical batch");
  sub->add_option("--base-batch", c->base_batch, "Global batch (sequences) of the run that trains well")->required();
  sub->add_option("--base-lr", c->base_lr, "Its peak learning rate")->required();
  sub->add_option("--base-warmup", c->base_warmup, "Its warmup steps")->capture_default_str();
  sub->add_option("--target-batch", c->target_batch, "The global batch to move to")->required();
  sub->add_option("--optimizer", c->optimizer, "adam (Adam, AdamW) or sgd")->capture_default_str();
  sub->add_option("--noise-scale", c->noise_scale, "Measured gradient noise scale B_simple, in sequences");
  sub->add_option("--metrics", c->metrics,
                  "A pipeflow train metrics.jsonl: its last noise_scale is the noise scale");
  sub->add_flag("--json", c->json, "Print one JSON object");
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
