// Elementwise math on host memory (the formulas: kernels/math.h), and select (where).
#pragma once

#include <cstdint>

#include "kernels/math.h"

namespace loom::kernels::cpu {

void unary(const float* x, float* y, int64_t n, UnaryOp op);
// dx = dL/dx from x, y = op(x) and dy.
void unary_backward(const float* x, const float* y, const float* dy, float* dx, int64_t n,
                    UnaryOp op);
void pow(const float* x, float e, float* y, int64_t n);
void pow_backward(const float* x, float e, const float* dy, float* dx, int64_t n);
void clamp(const float* x, float lo, float hi, float* y, int64_t n);
void clamp_backward(const float* x, float lo, float hi, const float* dy, float* dx, int64_t n);
// out[i] = condition[i] ? a[i] : b[i] (condition nonzero), all n long.
void select(const uint8_t* condition, const float* a, const float* b, float* out, int64_t n);

}  // namespace loom::kernels::cpu
