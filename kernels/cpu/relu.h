// ReLU, y = max(x, 0), and its derivative. At x == 0 the derivative is taken as 0 (PyTorch's
// convention), so a unit sitting exactly at zero passes no gradient.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

void relu_forward(const float* x, float* y, int64_t n);
// dx = dy where x > 0, else 0
void relu_backward(const float* x, const float* dy, float* dx, int64_t n);

}  // namespace loom::kernels::cpu
