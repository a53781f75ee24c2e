// A PyTorch pipelining CSV (pipeflow validate FILE.csv), then the validator on what it read.
#include "fuzz_target.h"
#include "pipeflow/schedule/io.h"
#include "pipeflow/schedule/validate.h"

PIPEFLOW_FUZZ_READER(pipeflow::validate(pipeflow::read_csv(text, "fuzz.csv")))
