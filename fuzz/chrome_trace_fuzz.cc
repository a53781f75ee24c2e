// A Chrome-trace JSON (the trace reader).
#include "fuzz_target.h"
#include "pipeflow/trace/chrome_trace.h"

PIPEFLOW_FUZZ_READER(pipeflow::read_chrome_trace(text, "fuzz.json"))
