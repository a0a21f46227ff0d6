// Elementwise f32 kernels. Binary ops broadcast b over a's leading dims: out[i] = a[i] op
// b[i % nb], with nb dividing n (nb == n is the plain case).
#pragma once

#include <cstdint>

#include "kernels/compare.h"

namespace loom::kernels::cpu {

void add(const float* a, const float* b, float* out, int64_t n, int64_t nb);
void sub(const float* a, const float* b, float* out, int64_t n, int64_t nb);
void mul(const float* a, const float* b, float* out, int64_t n, int64_t nb);
void div(const float* a, const float* b, float* out, int64_t n, int64_t nb);
// out[i] = a[i] op b[i % nb] as 1 / 0 (kernels/compare.h), the same broadcasting.
void compare(const float* a, const float* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op);
void compare(const int32_t* a, const int32_t* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op);
void compare(const int64_t* a, const int64_t* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op);
void compare(const uint8_t* a, const uint8_t* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op);
void scale(const float* x, float s, float* out, int64_t n);
void axpy(float* x, const float* y, float alpha, int64_t n);  // x += alpha * y
// out[c] = sum over r of x[r * cols + c]: the gradient of a broadcast operand.
void sum_rows(const float* x, float* out, int64_t rows, int64_t cols);
double sum_of_squares(const float* x, int64_t n);

}  // namespace loom::kernels::cpu
