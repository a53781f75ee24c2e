#pragma once

#include <nlohmann/json_fwd.hpp>

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
// simulate's layout keys (devices, tensor_parallel, ..., comm_mode) of a
// layout run with `microbatches` per replica and `chunks` chunks per rank.
nlohmann::ordered_json layout_json(const Layout& layout, int microbatches, int chunks);

}  // namespace pipeflow
