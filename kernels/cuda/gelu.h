// GELU (GPT-2's tanh approximation) forward and backward on device memory: the CUDA twins of
// kernels/cpu/gelu.h, with the same formula constants. The bf16 overloads read into f32, compute
// the same f32 formula and round once on store.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda {

void gelu_forward(const float* x, float* y, int64_t n, Stream stream);
void gelu_forward(const BFloat16* x, BFloat16* y, int64_t n, Stream stream);
// dx = dy * gelu'(x)
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, Stream stream);
void gelu_backward(const BFloat16* x, const BFloat16* dy, BFloat16* dx, int64_t n, Stream stream);

}  // namespace loom::kernels::cuda
