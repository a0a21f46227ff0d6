#include "kernels/cpu/math.h"

namespace loom::kernels::cpu {

// Elementwise loops share OpenMP's cut-off of the other elementwise kernels (sigmoid.cpp).
void unary(const float* x, float* y, int64_t n, UnaryOp op) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) y[i] = unary_value(x[i], op);
}

void unary_backward(const float* x, const float* y, const float* dy, float* dx, int64_t n,
                    UnaryOp op) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) dx[i] = unary_grad(x[i], y[i], dy[i], op);
}

void pow(const float* x, float e, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) y[i] = pow_value(x[i], e);
}

void pow_backward(const float* x, float e, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) dx[i] = pow_grad(x[i], e, dy[i]);
}

void clamp(const float* x, float lo, float hi, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = clamp_value(x[i], lo, hi);
}

void clamp_backward(const float* x, float lo, float hi, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dx[i] = clamp_grad(x[i], lo, hi, dy[i]);
}

void select(const uint8_t* condition, const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = condition[i] ? a[i] : b[i];
}

}  // namespace loom::kernels::cpu
