#include "pipeflow/nn/gradient_clipping.h"

#include <algorithm>

namespace pipeflow::nn {

double clip_coefficient(double global_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (global_norm + 1e-6));
}

}  // namespace pipeflow::nn
