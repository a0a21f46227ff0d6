// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace loom::optim {

// The L2 norm of all gradients together (f64 accumulation of each gradient's sum of squares;
// parameters without a gradient count for nothing). When max_norm / (norm + 1e-6) < 1 every
// gradient is scaled by that factor in place, so the clipped norm is just under max_norm.
// Returns the norm before clipping; a non-finite norm is returned as is and nothing is scaled,
// so the caller can skip the step.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace loom::optim
