// A Megatron-LM or DeepSpeed log (the timer-log reader, and the arguments
// block read as a Megatron launch line).
#include "fuzz_target.h"
#include "pipeflow/plan/job_log.h"

PIPEFLOW_FUZZ_READER(pipeflow::read_timer_log(text, "fuzz.log"))
