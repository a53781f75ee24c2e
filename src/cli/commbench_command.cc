#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <chrono>
#include <memory>
#include <string>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/units.h"
#include "pipeflow/runtime/commbench.h"
#include "pipeflow/runtime/mpi_world.h"

namespace pipeflow::cli {
namespace {

// "B,T,C": a layer's activation of B sequences, T positions and C features.
std::array<std::int64_t, 3> parse_activation(const std::string& text) {
  std::array<std::int64_t, 3> dims{};
  std::size_t at = 0;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const std::size_t end = i + 1 < dims.size() ? text.find(',', at) : text.size();
    const std::string field = end == std::string::npos ? "" : text.substr(at, end - at);
    std::int64_t value = 0;
    const auto [last, error] = std::from_chars(field.data(), field.data() + field.size(), value);
    if (field.empty() || error != std::errc() || last != field.data() + field.size()) {
      fail("--activation {}: expected B,T,C (sequences, positions, features), e.g. 8,64,512", text);
    }
    dims[i] = value;
    at = end + 1;
  }
  return dims;
}

struct CommbenchCommand {
  std::string min_bytes = "1K";
  std::string max_bytes = "64M";
  int iters = 20;
  int warmup = 5;
  double timeout_s = 60;
  bool json = false;
  std::string save_hardware;
  std::string hardware = "cpu";
  int tensor_parallel = 0;
  std::vector<std::string> activations;

  runtime::CommbenchOptions options() const {
    runtime::CommbenchOptions o{.min_bytes = parse_byte_size(min_bytes, "--min-bytes"),
                                .max_bytes = parse_byte_size(max_bytes, "--max-bytes"),
                                .iters = iters,
                                .warmup = warmup,
                                .timeout = std::chrono::duration<double>(timeout_s)};
    o.tensor_parallel = tensor_parallel;
    if (!activations.empty()) o.activations.clear();
    for (const std::string& text : activations) o.activations.push_back(parse_activation(text));
    runtime::validate_commbench_options(o);
    return o;
  }
};

void run(const runtime::CommbenchOptions& options, const HardwareProfile& base, const CommbenchCommand& c,
         const runtime::MpiWorld& mpi) {
  const runtime::CommbenchResult result = runtime::run_commbench(mpi, options);
  if (mpi.rank() != 0) return;
  write_output(c.json ? runtime::commbench_json(result) : runtime::commbench_text(result), "");
  if (!c.save_hardware.empty()) {
    write_file_atomic(c.save_hardware, hardware_to_json(runtime::with_measured_links(base, result)));
    fmt::print(stderr, "wrote {}: pipeflow simulate --hardware {} reads it\n", c.save_hardware, c.save_hardware);
  }
}

// The options and the base profile are checked before MPI starts (each
// process reports a bad one as any command does); after that a failing
// process ends the whole job.
void run(const CommbenchCommand& c) {
  const runtime::CommbenchOptions options = c.options();
  const HardwareProfile base = resolve_hardware(c.hardware);
  if (!runtime::MpiWorld::launched_by_mpirun()) {
    fail("commbench measures the links between the processes of an MPI job: start it with mpirun, e.g. "
         "mpirun -np 2 pipeflow commbench (as root add --allow-run-as-root; more processes than cores: "
         "--oversubscribe)");
  }
  const runtime::MpiWorld mpi;
  run_in_mpi_job([&] { run(options, base, c, mpi); });
}

}  // namespace

void add_commbench_command(CLI::App& app) {
  auto c = std::make_shared<CommbenchCommand>();
  CLI::App* sub = app.add_subcommand(
      "commbench",
      "Under mpirun: point-to-point and all-reduce latency and bandwidth between the processes, against raw MPI "
      "(like nccl-tests)");
  sub->add_option("--min-bytes", c->min_bytes, "Smallest message, a power of two (K, M, G: powers of 1024)")
      ->capture_default_str();
  sub->add_option("--max-bytes", c->max_bytes, "Largest message, a power of two")->capture_default_str();
  sub->add_option("--iters", c->iters, "Timed rounds per size")->capture_default_str();
  sub->add_option("--warmup", c->warmup, "Untimed rounds per size before them")->capture_default_str();
  sub->add_option("--timeout", c->timeout_s, "Longest any wait for a peer may take, in seconds")
      ->capture_default_str();
  sub->add_option("--tp,--tensor-parallel", c->tensor_parallel,
                  "Also measure the tensor-parallel all-reduce and all-gather over groups of this many consecutive "
                  "processes (0: not)")
      ->capture_default_str();
  sub->add_option("--activation", c->activations,
                  "A layer's activation B,T,C for the tensor-parallel test (repeatable; default 8,64,128 and "
                  "8,64,512)");
  sub->add_flag("--json", c->json, "Print the rows as JSON (nccl-tests' columns) instead of a table");
  sub->add_option("--save-hardware", c->save_hardware,
                  "Write a hardware profile with the measured link latency and bandwidth (atomically), for "
                  "pipeflow simulate --hardware FILE");
  sub->add_option("--hardware", c->hardware,
                  "The profile --save-hardware starts from: a preset or a JSON file (e.g. pipeflow calibrate's)")
      ->capture_default_str();
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
