// The run configuration (pipeflow train/simulate --config): parse and resolve.
#include "fuzz_target.h"
#include "pipeflow/config/run_config.h"

PIPEFLOW_FUZZ_READER({
  const pipeflow::RunConfig run = pipeflow::parse_run_config(pipeflow::Config::parse(text, "fuzz.json"));
  if (run.model) pipeflow::resolve(run);
})
