// Row-wise softmax over the last dim of a contiguous [rows, cols] f32 array, and its backward.
// The backward needs only the forward's output y: dx = y * (dy - sum(dy * y)).
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols);
void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols);

}  // namespace loom::kernels::cpu
