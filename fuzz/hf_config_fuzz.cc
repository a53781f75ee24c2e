// A Hugging Face config.json (--model PATH).
#include "fuzz_target.h"
#include "pipeflow/model/hf_config.h"

PIPEFLOW_FUZZ_READER(pipeflow::model_from_hf_config_text(text, "fuzz"))
