// Elementwise f32 kernels. Binary ops broadcast b over a's leading dims: out[i] = a[i] op
// b[i % nb], with nb dividing n (nb == n is the plain case).
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

void add(const float* a, const float* b, float* out, int64_t n, int64_t nb);
void sub(const float* a, const float* b, float* out, int64_t n, int64_t nb);
void mul(const float* a, const float* b, float* out, int64_t n, int64_t nb);
void scale(const float* x, float s, float* out, int64_t n);
void axpy(float* x, const float* y, float alpha, int64_t n);  // x += alpha * y
// out[c] = sum over r of x[r * cols + c]: the gradient of a broadcast operand.
void sum_rows(const float* x, float* out, int64_t rows, int64_t cols);
double sum_of_squares(const float* x, int64_t n);

}  // namespace loom::kernels::cpu
