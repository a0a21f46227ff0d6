// ReLU loops on host memory: branch-free selects, so GCC vectorises them.
#include "kernels/cpu/relu.h"

namespace loom::kernels::cpu {

void relu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

}  // namespace loom::kernels::cpu
