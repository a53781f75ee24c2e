#pragma once

namespace pipeflow::nn {

// Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ and
// DeepSpeed's gradient_clipping: with the norm over every stage's gradients
// (√ of the sum of Stage::gradient_square_sum over the pipeline, after the
// tied-gradient reduction), every gradient is multiplied by
// min(1, max_norm / (norm + 1e-6)). max_norm <= 0 disables clipping (1).
double clip_coefficient(double global_norm, double max_norm);

}  // namespace pipeflow::nn
