#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <memory>
#include <string>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/units.h"
#include "pipeflow/runtime/calibrate.h"

namespace pipeflow::cli {
namespace {

struct CalibrateCommand {
  std::string output;
  std::string name = "calibrated";
  runtime::CalibrationOptions options;
  std::string gemm_width = "128";  // parsed here, so that a word gets the flag's own rule and fix
  std::string gemm_rows = "512,8";
};

// `text` as a whole number, or an Error naming the flag, its value, the rule and the fix.
int whole_number(std::string_view text, std::string_view flag, std::string_view value, std::string_view rule) {
  int number = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    fail("{} {}: '{}' is not a whole number: {}", flag, value, text, rule);
  }
  return number;
}

void parse_gemm_flags(CalibrateCommand& command) {
  command.options.gemm_width =
      whole_number(command.gemm_width, "--gemm-width", command.gemm_width,
                   fmt::format("give the model width C in [{}, {}], e.g. your model's n_embd (128)",
                               runtime::kMinGemmWidth, runtime::kMaxGemmWidth));
  command.options.gemm_rows.clear();
  std::string_view rows = command.gemm_rows;
  while (true) {
    const std::size_t comma = rows.find(',');
    command.options.gemm_rows.push_back(whole_number(
        rows.substr(0, comma), "--gemm-rows", command.gemm_rows,
        fmt::format("give row counts separated by commas, each in [1, {}], e.g. --gemm-rows 512,8",
                    runtime::kMaxGemmRows)));
    if (comma == std::string_view::npos) break;
    rows.remove_prefix(comma + 1);
  }
}

// "label:" padded to one column (the longest GEMM's), then its figure.
void print_line(const std::string& label, const std::string& figure) {
  fmt::print(stderr, "{:<32}{}\n", label, figure);
}

// Every measurement; the limits and the rates as shares of the best ISA's
// fp32 peak where it is known.
void print_measurements(const runtime::Calibration& c, const HardwareProfile& profile) {
  const double peak = profile.best_core_fp32_peak();
  const auto share = [&](double rate) {
    return peak > 0 ? fmt::format(" = {} of the {} fp32 peak", format_percent(rate / peak), profile.best_core_fp32_isa())
                    : std::string(" (no fp32 peak: this CPU has neither AVX2+FMA nor AVX-512)");
  };
  for (const CorePeak& core : c.core_peaks) {
    print_line(fmt::format("core peak, {} {}:", core.precision, core.isa),
               format_si(core.flop_per_s, "FLOP/s") + (core.precision == "fp32" ? share(core.flop_per_s) : ""));
  }
  print_line("sgemm 512³, one thread:", format_si(c.sgemm_flop_per_s, "FLOP/s") + share(c.sgemm_flop_per_s));
  // A bf16 run's products, against the core's bf16 peak where they are bf16.
  double bf16_peak = 0;
  for (const auto& [isa, rate] : profile.peak_bf16_flop_per_s_by_isa) bf16_peak = std::max(bf16_peak, rate);
  const bool bf16_matmul = c.bf16_gemm == GemmPrecision::kBf16;
  print_line("bf16 GEMM 512³, one thread:",
             format_si(c.bf16_gemm_flop_per_s, "FLOP/s") +
                 (bf16_matmul ? " (bf16 matmul)" + (bf16_peak > 0 ? fmt::format(" = {} of the bf16 peak",
                                                                                format_percent(c.bf16_gemm_flop_per_s /
                                                                                               bf16_peak))
                                                                  : std::string())
                              : " (sgemm)" + share(c.bf16_gemm_flop_per_s)));
  for (const GemmRate& rate : c.gemm_rates) {
    print_line(fmt::format("  sgemm {} m{} k{} n{}:", rate.gemm, rate.m, rate.k, rate.n),
               format_si(rate.flop_per_s, "FLOP/s") + share(rate.flop_per_s));
  }
  print_line("GPT-2 training step:", fmt::format("{} ({} of sgemm: the efficiency){}",
                                                 format_si(c.model_flop_per_s, "FLOP/s"),
                                                 format_percent(profile.efficiency), share(c.model_flop_per_s)));
  print_line("memory, triad:", format_si(c.triad_bytes_per_s, "B/s"));
  print_line("memcpy, one thread:", format_si(c.memcpy_bytes_per_s, "B/s"));
  print_line("thread hand-off:", format_seconds(c.handoff_latency_s));
  print_line("cores (devices per node):", std::to_string(c.cores));
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto command = std::make_shared<CalibrateCommand>();
  CLI::App* sub = app.add_subcommand(
      "calibrate", "Measure this machine (the core's FMA peak per ISA, sgemm at the model's shapes, memory "
      "bandwidth, memcpy, thread hand-off, a GPT training step) as a hardware profile");
  sub->add_option("-o,--output", command->output,
                  "Write the profile JSON to FILE (atomically) instead of standard output; "
                  "pipeflow simulate --hardware FILE reads it");
  sub->add_option("--name", command->name, "The profile's name")->capture_default_str();
  sub->add_option("--seconds", command->options.seconds_per_measurement,
                  fmt::format("Time spent on each of the seven measurements, in (0, {:g}]",
                              runtime::kMaxSecondsPerMeasurement))
      ->capture_default_str();
  sub->add_option("--gemm-width", command->gemm_width,
                  fmt::format("The model width C whose GEMMs (qkv, proj, fc, fc_proj) are timed, in [{}, {}]",
                              runtime::kMinGemmWidth, runtime::kMaxGemmWidth))
      ->capture_default_str();
  sub->add_option("--gemm-rows", command->gemm_rows,
                  fmt::format("Rows M of those GEMMs, comma-separated, each in [1, {}]: micro-batch × sequence "
                              "length, decode group sizes",
                              runtime::kMaxGemmRows))
      ->capture_default_str();
  sub->callback([command] {
    parse_gemm_flags(*command);
    const runtime::Calibration c = runtime::calibrate(command->options);
    const HardwareProfile profile = runtime::calibrated_profile(c, command->name);
    // The figures go to standard error so that standard output can be the JSON.
    print_measurements(c, profile);
    write_output(hardware_to_json(profile), command->output);
    if (!command->output.empty()) fmt::print(stderr, "wrote {}\n", command->output);
  });
}

}  // namespace pipeflow::cli
