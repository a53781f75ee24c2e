// A measured profile (pipeflow simulate --profile) and a hardware profile (--hardware FILE).
#include "fuzz_target.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/sim/profile.h"

PIPEFLOW_FUZZ_READER({
  try {
    pipeflow::profile_from_json(text, "fuzz.json");
  } catch (const pipeflow::Error&) {
  }
  pipeflow::hardware_from_json(text, "fuzz.json");
})
