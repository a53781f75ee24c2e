// `pipeflow review`: a pre-flight review of a run configuration, each
// finding with its severity, number and fix; exit status 1 on an error finding.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"
#include "pipeflow/plan/review.h"
#include "run_options.h"

namespace pipeflow::cli {
namespace {

struct ReviewCommand {
  std::string config;
  std::string noise_scale;
  std::string base_batch;
  std::string base_lr;
  bool json = false;
  RunFlags flags;
};

// The whole text as a finite number, or an Error naming the flag, the text, the rule and the fix.
double number_of(const std::string& flag, const std::string& text, const char* rule) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value) || !(value > 0)) {
    fail("{} {}: must be {}", flag, quoted_excerpt(text), rule);
  }
  return value;
}

ReviewOptions options_of(const ReviewCommand& c) {
  ReviewOptions options;
  if (!c.noise_scale.empty()) {
    options.noise_scale = number_of("--noise-scale", c.noise_scale,
                                    "a positive number of sequences (B_simple, the gradient noise scale that "
                                    "pipeflow train writes into metrics.jsonl), e.g. --noise-scale 512");
  }
  if (!c.base_batch.empty()) {
    const double batch = number_of("--base-batch", c.base_batch,
                                   "a whole positive number of sequences: the reference run's global batch");
    if (batch != std::floor(batch)) fail("--base-batch {}: must be a whole number of sequences", c.base_batch);
    options.base_batch = static_cast<long long>(batch);
  }
  if (!c.base_lr.empty()) {
    options.base_lr = number_of("--base-lr", c.base_lr, "a positive learning rate: the reference run's, e.g. 3e-4");
  }
  return options;
}

int run(const ReviewCommand& c) {
  if (c.config.empty()) {
    fail("--config is required: the run configuration to review (pipeflow keys or DeepSpeed's JSON), e.g. "
         "pipeflow review --config examples/train_1f1b_2stage.json");
  }
  const ReviewOptions options = options_of(c);
  const ReviewedConfig read = read_for_review(c.config, c.flags.overrides());
  print_config_notes(read.config);
  const Review r = review(resolve(read.config), options, read.refusal);
  write_output(c.json ? review_json(r) : review_text(r), "");
  return r.has_error() ? 1 : 0;
}

}  // namespace

void add_review_command(CLI::App& app) {
  auto c = std::make_shared<ReviewCommand>();
  CLI::App* sub = app.add_subcommand(
      "review", "Review a run configuration before it runs: memory, bubble, micro-batches, ZeRO, tensor parallelism, "
                "batch and learning rate, balance, overlap, recompute, host overhead; each finding with its number "
                "and fix");
  sub->add_option("--config", c->config, "Run configuration (pipeflow keys or DeepSpeed's JSON); flags override it");
  c->flags.add_to(sub, {FlagScope::kAll});
  sub->add_option("--noise-scale", c->noise_scale,
                  "Gradient noise scale B_simple in sequences: a global batch past it is a finding");
  sub->add_option("--base-batch", c->base_batch,
                  "Global batch of a reference run that trains well (with --base-lr): the learning rate is checked "
                  "against advise-batch's rule");
  sub->add_option("--base-lr", c->base_lr, "That reference run's peak learning rate (with --base-batch)");
  sub->add_flag("--json", c->json, "Print the findings as one JSON object");
  sub->callback([c] {
    if (run(*c) != 0) throw ExitStatus{1};  // an error finding, printed with the rest
  });
}

}  // namespace pipeflow::cli
