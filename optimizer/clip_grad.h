// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_, in two halves so sharded
// training (ZeRO) can sum the squares over its ranks in between.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace loom::optim {

// The sum of squares of every gradient (f64 accumulation; parameters without a gradient count
// for nothing).
double grad_sum_of_squares(const std::vector<Tensor>& params);

// When max_norm / (norm + 1e-6) < 1, scales every gradient by that factor in place, so the
// clipped norm is just under max_norm. A non-finite norm scales nothing (the caller can skip
// the step).
void scale_grads_to_norm(const std::vector<Tensor>& params, double norm, double max_norm);

// Both halves on one process: returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace loom::optim
