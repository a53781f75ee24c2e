#pragma once

#include <string>

#include "pipeflow/sim/prediction.h"

namespace pipeflow {

// A prediction as `pipeflow simulate` reports it: the layout in a line, the
// step (time, bubble, steady state, tokens/s, MFU), a table per rank (busy,
// communication, optimizer, idle, memory) and per stage (layers, costs).
std::string prediction_text(const Prediction& prediction);

// The same as one JSON object (pretty, 2 spaces): model, hardware, layout
// (simulate's layout keys), step_time_s, bubble_ratio, tokens_per_s, mfu, ...,
// ranks[], stages[], warnings[].
std::string prediction_json(const Prediction& prediction);

}  // namespace pipeflow
