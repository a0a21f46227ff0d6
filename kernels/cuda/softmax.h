// Row-wise softmax over the last dim of a contiguous [rows, cols] array on device memory, and its
// backward: the CUDA twins of kernels/cpu/softmax.h, for f32 and bf16 (read into f32, computed in
// f32, rounded once on store). The same formula as the CPU's, so special values behave the same:
// -inf entries get 0, and a row that is entirely -inf gets NaN (its max is -inf, and
// -inf - -inf is NaN), as on the CPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda {

// y = exp(x - max) / sum(exp(x - max)) per row. y == x is allowed.
void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols, Stream stream);
void softmax_forward(const BFloat16* x, BFloat16* y, int64_t rows, int64_t cols, Stream stream);

// dx = y * (dy - sum(dy * y)) per row, from the forward's output y.
void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                      Stream stream);
void softmax_backward(const BFloat16* y, const BFloat16* dy, BFloat16* dx, int64_t rows,
                      int64_t cols, Stream stream);

}  // namespace loom::kernels::cuda
