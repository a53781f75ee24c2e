// A run configuration written in YAML (parse_yaml, then the run
// configuration's reader with DeepSpeed's keys as written).
#include "fuzz_target.h"
#include "pipeflow/config/run_config.h"
#include "pipeflow/core/json.h"

#include <nlohmann/json.hpp>

PIPEFLOW_FUZZ_READER(pipeflow::parse_run_config(
    pipeflow::Config::from_json(pipeflow::parse_yaml(text, "fuzz.yaml"), "fuzz.yaml")))
