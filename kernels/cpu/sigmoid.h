// Logistic sigmoid, y = 1 / (1 + exp(-x)), and its derivative from the saved output,
// dy/dx = y (1 - y), so the backward needs no exp.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

void sigmoid_forward(const float* x, float* y, int64_t n);
// dx = dy * y * (1 - y), y the forward's output
void sigmoid_backward(const float* y, const float* dy, float* dx, int64_t n);

}  // namespace loom::kernels::cpu
