// Logistic sigmoid forward and backward on device memory: the CUDA twins of kernels/cpu/sigmoid.h
// (same arguments and meaning, plus a trailing stream). The same f32 formulas: the forward differs
// from the CPU only in expf's last bit (CUDA's expf is within 2 ulp; the quotient then agrees to
// ~1e-7 relative); the backward is the same three roundings in the same order, so bit for bit.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

void sigmoid_forward(const float* x, float* y, int64_t n, Stream stream);
// dx = dy * y * (1 - y), y the forward's output
void sigmoid_backward(const float* y, const float* dy, float* dx, int64_t n, Stream stream);

}  // namespace loom::kernels::cuda
