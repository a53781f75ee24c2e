#include "pipeflow/runtime/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>

#include "pipeflow/core/units.h"
#include "pipeflow/nn/model_config.h"
#include "pipeflow/runtime/noise_scale.h"
#include "pipeflow/runtime/measurement.h"

namespace pipeflow::runtime {

namespace {

// The steps a report summarises: all but the warm-up step 0 when there are more.
std::vector<const StepFigures*> steady_steps(const RunRecord& run) {
  std::vector<const StepFigures*> steps;
  for (std::size_t i = run.figures.size() > 1 ? 1 : 0; i < run.figures.size(); ++i) steps.push_back(&run.figures[i]);
  return steps;
}

double median_of(const std::vector<const StepFigures*>& steps, const std::function<double(const StepFigures&)>& f) {
  std::vector<double> values;
  for (const StepFigures* s : steps) values.push_back(f(*s));
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string seconds_or_dash(double seconds) { return seconds > 0 ? format_seconds(seconds) : "-"; }

std::string signed_percent(double measured, double predicted) {
  if (predicted <= 0) return "-";
  return fmt::format("{:+.1f}%", 100.0 * (measured - predicted) / predicted);
}

std::string run_section(const RunRecord& run) {
  const TrainSettings& s = *run.settings;
  const Schedule& schedule = *run.schedule;
  const int b = s.engine.micro_batch;
  const int t = s.engine.seq_length;
  std::string out = "## Run\n\n";
  out += fmt::format("- configuration: `{}`\n", s.config_source.empty() ? "(command line)" : s.config_source);
  out += fmt::format("- model: {}\n", run.model);
  out += fmt::format("- data: {}\n", run.data);
  out += fmt::format(
      "- schedule: {} on {} ranks, {} stages ({} per rank, {} placement); {} micro-batches of {} sequences x {} "
      "tokens = {} tokens per step\n",
      schedule.name(), schedule.num_ranks(), schedule.num_stages(), schedule.chunks_per_rank(),
      to_string(schedule.placement()), schedule.num_microbatches(), b, t,
      static_cast<std::int64_t>(schedule.num_microbatches()) * b * t);
  out += fmt::format("- activation checkpoint interval: {}\n", s.engine.recompute_interval);
  const nn::AdamWOptions& o = s.engine.optimizer;
  out += fmt::format("- optimizer: {} lr {:g}, betas ({:g}, {:g}), eps {:g}, weight decay {:g}; {}; gradient clipping {}\n",
                     o.decoupled_decay ? "AdamW" : "Adam (L2 weight decay)", o.lr, o.betas[0], o.betas[1], o.eps,
                     o.weight_decay, s.engine.lr_schedule.describe(),
                     s.engine.gradient_clipping > 0 ? fmt::format("{:g}", s.engine.gradient_clipping) : "off");
  out += fmt::format("- steps: {}, {}\n", run.log.size(),
                     s.emulate ? "emulated: every action run alone on one thread, the timeline replayed with one "
                                 "core per rank"
                               : run.placement);
  if (!run.oversubscription.empty()) out += "\n> " + run.oversubscription + "\n";
  return out;
}

std::string partition_section(const RunRecord& run) {
  const Schedule& schedule = *run.schedule;
  std::string out = fmt::format(
      "\n## Partition ({})\n\nPer micro-batch, medians of the measured actions of {} (step 0 warms the buffer pools "
      "up; it is used alone only when the run has no other step).\n\n",
      to_string(run.settings->partition), run.cost_steps);
  out += "| stage | rank | layers | F | B | I | W | optimizer | activations held |\n";
  out += "|---|---|---|---|---|---|---|---|---|\n";
  for (int s = 0; s < schedule.num_stages(); ++s) {
    const StageCosts c = run.costs->stage(StageId(s));
    const int first = run.boundaries[static_cast<std::size_t>(s)];
    const int last = run.boundaries[static_cast<std::size_t>(s) + 1] - 1;
    const std::string layers =
        first == last ? run.layer_name(first) : fmt::format("{} .. {}", run.layer_name(first), run.layer_name(last));
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", s, schedule.rank_of(StageId(s)), layers,
                       seconds_or_dash(c.forward_s), seconds_or_dash(c.backward_s), seconds_or_dash(c.backward_input_s),
                       seconds_or_dash(c.backward_weight_s), seconds_or_dash(c.optimizer_s),
                       format_bytes(c.activation_bytes));
  }
  return out;
}

std::string comparison_section(const RunRecord& run) {
  const auto steps = steady_steps(run);
  const SimulationResult& p = *run.prediction;
  const char* measured = run.settings->emulate ? "emulated" : "measured";
  std::string out = fmt::format(
      "\n## {} vs predicted\n\nMedians over steps {} … {}; the prediction replays the schedule with the median cost "
      "of each (stage, kind) through the simulator's execution semantics.\n\n",
      run.settings->emulate ? "Emulated" : "Measured", steps.size() == run.figures.size() ? 0 : 1, run.figures.size() - 1);
  out += fmt::format("| | {} | predicted | difference |\n|---|---|---|---|\n", measured);
  const double step = median_of(steps, [](const StepFigures& f) { return f.wall_s; });
  const double pipeline = median_of(steps, [](const StepFigures& f) { return f.pipeline_s; });
  const double tokens = median_of(steps, [](const StepFigures& f) { return f.tokens_per_s; });
  const double bubble = median_of(steps, [](const StepFigures& f) { return f.bubble; });
  const double predicted_tokens = run.log.empty() ? 0 : run.log.back().tokens_per_s_predicted;
  out += fmt::format("| step time | {} | {} | {} |\n", format_seconds(step), format_seconds(p.step_time_s),
                     signed_percent(step, p.step_time_s));
  out += fmt::format("| pipeline (flush excluded) | {} | {} | {} |\n", format_seconds(pipeline),
                     format_seconds(p.pipeline_time_s), signed_percent(pipeline, p.pipeline_time_s));
  out += fmt::format("| tokens/s | {:.0f} | {:.0f} | {} |\n", tokens, predicted_tokens,
                     signed_percent(tokens, predicted_tokens));
  out += fmt::format("| bubble | {} | {} | {:+.1f} pp |\n", format_percent(bubble),
                     format_percent(p.pipeline_bubble_ratio), 100 * (bubble - p.pipeline_bubble_ratio));
  out += fmt::format(
      "\nPer rank (compute: F/B/I/W; idle: the pipeline's makespan less compute; overhead: hand-offs and "
      "bookkeeping between actions, part of idle):\n\n"
      "| rank | compute {0} | compute predicted | idle {0} | idle predicted | overhead | bubble {0} | bubble "
      "predicted | flush | peak activations {0} | peak activations predicted |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n",
      measured);
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const auto rank = [&](const std::function<double(const RankFigures&)>& f) {
      return median_of(steps, [&](const StepFigures& s) { return f(s.ranks[r]); });
    };
    const double compute = rank([](const RankFigures& f) { return f.compute_s; });
    const double predicted = p.ranks[r].busy_s;  // F/B/I/W (the optimizer is counted apart)
    out += fmt::format(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r, format_seconds(compute),
        format_seconds(predicted), format_seconds(pipeline - compute), format_seconds(p.pipeline_time_s - predicted),
        format_seconds(rank([](const RankFigures& f) { return f.comm_s + f.other_s; })),
        format_percent(rank([](const RankFigures& f) { return f.bubble; })),
        format_percent(1 - predicted / p.pipeline_time_s),
        format_seconds(rank([](const RankFigures& f) { return f.flush_s; })),
        format_bytes(rank([](const RankFigures& f) { return static_cast<double>(f.peak_activation_bytes); })),
        format_bytes(p.ranks[r].activation_bytes));
  }
  out += "\nPredicted peak activations come from the simulator's walk over each rank's actions with the measured "
         "bytes an F (an I) leaves held per micro-batch, plus the most an action of the stage holds while it runs "
         "(its temporaries, a recomputed segment) on top of what the rank holds when it begins.\n";
  if (!run.settings->emulate) {
    // Time the prediction does not have, per rank: median per step and the worst step.
    const auto per_rank = [&](double RankFigures::*figure) {
      std::string line;
      for (std::size_t r = 0; r < p.ranks.size(); ++r) {
        double worst = 0;
        for (const StepFigures* s : steps) worst = std::max(worst, s->ranks[r].*figure);
        line += fmt::format("{} rank {} {} (worst {})", r == 0 ? "" : ",", r,
                            format_seconds(median_of(steps, [&](const StepFigures& f) { return f.ranks[r].*figure; })),
                            format_seconds(worst));
      }
      return line;
    };
    out += fmt::format(
        "\nWhere steps lose time the prediction does not have, median per step and the worst step. Off core, the "
        "part of each rank's compute its thread did not run (another process or thread held the core):{}. Wake, the "
        "part of each rank's blocked receives after the peer's send had ended (the hand-off and the waiting "
        "thread's wake-up):{}.\n",
        per_rank(&RankFigures::off_core_s), per_rank(&RankFigures::wake_s));
  }
  if (run.settings->engine.data_parallel > 1) {
    out += fmt::format(
        "\nData-parallel reduction over the {} replicas (median per step): each stage's gradients reduce-scattered, "
        "posted as soon as the rank has run the stage's last B or W (a stage holding a side of the tied wte after "
        "the tied exchange), then all-gathered ({}). Posted early: the part in flight before the rank's last "
        "pipeline action ended (MPI advances it between actions, not during one).\n\n| rank | reduction | posted "
        "early |\n|---|---|---|\n",
        run.settings->engine.data_parallel,
        run.settings->engine.shard_optimizer ? "ZeRO-1: the weights each replica updated from its part"
                                             : "the summed gradients");
    for (std::size_t r = 0; r < p.ranks.size(); ++r) {
      const double total = median_of(steps, [&](const StepFigures& s) { return s.ranks[r].data_parallel_s; });
      const double early = median_of(steps, [&](const StepFigures& s) { return s.ranks[r].data_parallel_early_s; });
      out += fmt::format("| {} | {} | {} ({}) |\n", r, format_seconds(total), format_seconds(early),
                         format_percent(total > 0 ? early / total : 0));
    }
  }
  return out;
}

// Tensor parallelism: each rank's collectives inside its actions per step,
// measured (median, min, max over the steady steps) beside the simulator's
// price of the same all-reduces (a ring over the tensor-parallel group's
// link of the run's hardware profile, as simulate prices them).
std::string tensor_parallel_section(const RunRecord& run) {
  const int t = run.settings->engine.tensor_parallel;
  if (t <= 1) return "";
  const std::vector<const StepFigures*> steps = steady_steps(run);
  if (steps.empty()) return "";
  const HardwareProfile& hw = run.settings->hardware;
  std::string out = fmt::format(
      "\n## Tensor parallelism\n\nEach stage split over {} tensor-parallel ranks (Megatron-LM's scheme): per step, "
      "the collectives inside each rank's actions (2 a block in F and 2 in I, 1 in the embedding's F, the head's "
      "two row-wise ones in F and 1 in I; recomputation repeats the F ones, sequence parallelism turns them into "
      "all-gathers and reduce-scatters), measured over {} beside the simulator's ring all-reduce of the same "
      "bytes on {}'s link between devices 0 and {} ({}/s, collective efficiency {:.0f}%). The share is of the rank's compute time, which "
      "includes them.\n\n| rank | all-reduces | bytes | measured median (min - max) | predicted | share of "
      "compute |\n|---|---|---|---|---|---|\n",
      t, format_count(static_cast<std::int64_t>(steps.size()), "step"), hw.name, t - 1, format_bytes(link_between(hw, 0, t - 1).bandwidth_bytes_per_s),
      100 * hw.collective_efficiency);
  for (std::size_t r = 0; r < steps.front()->ranks.size(); ++r) {
    std::vector<double> seconds;
    for (const StepFigures* s : steps) seconds.push_back(s->ranks[r].tensor_parallel_s);
    std::sort(seconds.begin(), seconds.end());
    const RankFigures& last = steps.back()->ranks[r];
    const double predicted = predicted_tensor_parallel_s(last, t, hw);
    const double median = median_of(steps, [&](const StepFigures& s) { return s.ranks[r].tensor_parallel_s; });
    const double compute = median_of(steps, [&](const StepFigures& s) { return s.ranks[r].compute_s; });
    out += fmt::format("| {} | {} | {} | {} ({} - {}) | {} | {} |\n", r, last.tensor_parallel_collectives,
                       format_bytes(static_cast<double>(last.tensor_parallel_bytes)), format_seconds(median),
                       format_seconds(seconds.front()), format_seconds(seconds.back()), format_seconds(predicted),
                       format_percent(compute > 0 ? median / compute : 0));
  }
  out += "\nThe rows are replica 0's tensor-parallel rank 0 of each pipeline rank; the other tensor-parallel ranks "
         "wait in the same collectives.\n";
  return out;
}

std::string loss_section(const RunRecord& run) {
  std::string out = "\n## Loss\n\n| step | loss | validation loss |\n|---|---|---|\n";
  const std::size_t n = run.log.size();
  std::vector<std::size_t> rows = {0};
  for (const double at : {0.25, 0.5, 0.75}) rows.push_back(static_cast<std::size_t>(at * static_cast<double>(n - 1)));
  for (std::size_t i = 0; i < n; ++i) {
    if (run.log[i].val_loss) rows.push_back(i);
  }
  rows.push_back(n - 1);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  for (const std::size_t i : rows) {
    const StepLog& l = run.log[i];
    out += fmt::format("| {} | {:.4f} | {} |\n", l.step, l.loss, l.val_loss ? fmt::format("{:.4f}", *l.val_loss) : "");
  }
  const auto lowest = std::min_element(run.log.begin(), run.log.end(),
                                       [](const StepLog& a, const StepLog& b) { return a.loss < b.loss; });
  out += fmt::format("\nFirst loss {:.4f}, last {:.4f}, lowest {:.4f} (step {}); ln {} = {:.4f} is a uniform guess.\n",
                     run.log.front().loss, run.log.back().loss, lowest->loss, lowest->step,
                     run.settings->model.vocab_size, std::log(static_cast<double>(run.settings->model.vocab_size)));
  return out;
}

std::string noise_scale_section(const RunRecord& run) {
  std::string out = "\n## Gradient noise scale\n\n";
  const EngineOptions& engine = run.settings->engine;
  const int interval = engine.noise_scale_interval;
  if (interval == 0) return out + "Not measured (metrics.noise_scale_interval = 0).\n";
  const NoiseMicrobatch small = noise_microbatch(*run.schedule, engine.data_parallel, engine.sequence_parallel);
  if (!small.microbatch) return out + fmt::format("Not measured: {}.\n", small.obstacle);
  const auto measured = std::count_if(run.log.begin(), run.log.end(),
                                      [](const StepLog& l) { return l.grad_square_small.has_value(); });
  const auto last = std::find_if(run.log.rbegin(), run.log.rend(),
                                 [](const StepLog& l) { return l.noise_scale.has_value(); });
  const std::int64_t big = static_cast<std::int64_t>(run.schedule->num_microbatches()) * engine.micro_batch *
                           engine.data_parallel;
  out += fmt::format(
      "B_simple = tr(Σ)/|G|² (McCandlish et al. 2018, Appendix A), in sequences, from |G_small|² of one micro-batch "
      "(b = {} sequences: micro-batch {} of data-parallel replica 0, each stage's gradient read right after its "
      "weight gradient of it) and |G_big|² of the global batch (B = {}), {} (metrics.noise_scale_interval); "
      "the value is the ratio of exponential moving averages (decay {}) of the two unbiased estimates, over {} "
      "measured {} of this run. `metrics.jsonl` has `grad_square_small`, `grad_square_big` and `noise_scale` on "
      "those steps; `pipeflow advise-batch --metrics` reads the last `noise_scale`. Cost: one more pass over the "
      "gradients and a copy of the tied wte gradient per measured step (docs/PERFORMANCE.md).\n\n",
      engine.micro_batch, *small.microbatch, big,
      interval == 1 ? std::string("every step") : fmt::format("every {} steps", interval), NoiseScaleAverage::kDecay,
      measured, measured == 1 ? "step" : "steps");
  if (last == run.log.rend()) {
    return out + "No estimate yet: the averaged |G|² is not positive (the small batch's noise outweighs the "
                 "signal over so few measurements; train longer).\n";
  }
  const double noise = *last->noise_scale;
  const bool past = static_cast<double>(big) > noise;
  out += fmt::format("B_simple ≈ {:.1f} sequences at step {}: the global batch of {} is {} it{}.\n", noise,
                     last->step, big, past ? "past" : "within",
                     past ? "; past the critical batch size a larger batch wastes samples (pipeflow advise-batch "
                            "--metrics)"
                          : "");
  return out;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 && c != '\n' && c != '\t') || byte >= 0x7f) c = '?';
  }
  return out;
}

std::string training_report(const RunRecord& run) {
  std::string out = fmt::format("# Training report: {}\n\n", run.settings->out_dir.string());
  out += run_section(run);
  out += partition_section(run);
  out += comparison_section(run);
  out += tensor_parallel_section(run);
  out += loss_section(run);
  out += noise_scale_section(run);
  out += fmt::format("\n## Configuration\n\nAs read (defaults written out; flags applied):\n\n```json\n{}```\n",
                     run.settings->config_text);
  out += fmt::format(
      "\n## Sample\n\n{} (bytes that are not printable ASCII shown as ?):\n\n```text\n{}\n```\n", run.sample_note,
      printable(run.sample));
  out += fmt::format(
      "\n## Files\n\n- `metrics.jsonl`: one JSON object per step\n- `timeline.svg`, `trace.json`: the last step, {} "
      "(open the trace in Perfetto or chrome://tracing)\n- `predicted.svg`: the same step as predicted\n- "
      "`weights.safetensors`: {}\n",
      run.settings->emulate ? "emulated" : "measured", run.weights_note);
  return out;
}

}  // namespace pipeflow::runtime
