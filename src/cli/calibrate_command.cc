#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "pipeflow/core/units.h"
#include "pipeflow/runtime/calibrate.h"

namespace pipeflow::cli {
namespace {

struct CalibrateCommand {
  std::string output;
  std::string name = "calibrated";
  double seconds = 0.5;
};

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto command = std::make_shared<CalibrateCommand>();
  CLI::App* sub = app.add_subcommand(
      "calibrate", "Measure this machine (sgemm, memcpy, thread hand-off, a GPT training step) as a hardware profile");
  sub->add_option("-o,--output", command->output,
                  "Write the profile JSON to FILE (atomically) instead of standard output; "
                  "pipeflow simulate --hardware FILE reads it");
  sub->add_option("--name", command->name, "The profile's name")->capture_default_str();
  sub->add_option("--seconds", command->seconds,
                  fmt::format("Time spent on each of the four measurements, in (0, {:g}]",
                              runtime::kMaxSecondsPerMeasurement))
      ->capture_default_str();
  sub->callback([command] {
    const runtime::Calibration c = runtime::calibrate({.seconds_per_measurement = command->seconds});
    const HardwareProfile profile = runtime::calibrated_profile(c, command->name);
    // The figures go to standard error so that standard output can be the JSON.
    fmt::print(stderr,
               "sgemm, one thread:        {}\n"
               "GPT-2 training step:      {} ({} of sgemm: the efficiency)\n"
               "memcpy, one thread:       {}\n"
               "thread hand-off:          {}\n"
               "cores (devices per node): {}\n",
               format_si(c.sgemm_flop_per_s, "FLOP/s"), format_si(c.model_flop_per_s, "FLOP/s"),
               format_percent(profile.efficiency), format_si(c.memcpy_bytes_per_s, "B/s"),
               format_seconds(c.handoff_latency_s), c.cores);
    write_output(hardware_to_json(profile), command->output);
    if (!command->output.empty()) fmt::print(stderr, "wrote {}\n", command->output);
  });
}

}  // namespace pipeflow::cli
