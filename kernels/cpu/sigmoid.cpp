// Sigmoid loops on host memory. 1 / (1 + exp(-x)) needs no case split in f32: for large negative x
// exp(-x) overflows to inf and the result is 0 (the true value is below f32's smallest normal
// from x < -87 on); otherwise 1 + exp(-x) rounds with relative error below 2^-24, so small results
// keep their digits (there is no cancellation as in 1 - 1 / (1 + exp(x))).
#include "kernels/cpu/sigmoid.h"

#include <cmath>

namespace loom::kernels::cpu {

void sigmoid_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

void sigmoid_backward(const float* y, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

}  // namespace loom::kernels::cpu
