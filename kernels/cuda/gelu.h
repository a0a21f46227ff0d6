// GELU (GPT-2's tanh approximation) forward and backward on device memory: the CUDA twins of
// kernels/cpu/gelu.h, with the same formula constants.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

void gelu_forward(const float* x, float* y, int64_t n, Stream stream);
// dx = dy * gelu'(x)
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, Stream stream);

}  // namespace loom::kernels::cuda
