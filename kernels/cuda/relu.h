// ReLU forward and backward on device memory: the CUDA twins of kernels/cpu/relu.h (same
// arguments and meaning, plus a trailing stream). At x == 0 the derivative is 0, as on the CPU;
// a NaN input gives 0 forward and a 0 gradient (x > 0 is false), as on the CPU. Results equal the
// CPU's bit for bit (selects, no arithmetic).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

void relu_forward(const float* x, float* y, int64_t n, Stream stream);
// dx = dy where x > 0, else 0
void relu_backward(const float* x, const float* dy, float* dx, int64_t n, Stream stream);

}  // namespace loom::kernels::cuda
