#include "kernels/cpu/elementwise.h"

#include <vector>

namespace loom::kernels::cpu {

namespace {

// The broadcast operand repeats every nb elements, so walk a in rows of nb: the inner loop is a
// plain vectorisable loop over two contiguous arrays.
template <typename T, typename U, typename Op>
void binary(const T* a, const T* b, U* out, int64_t n, int64_t nb, Op op) {
  const int64_t rows = nb > 0 ? n / nb : 0;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const T* ar = a + r * nb;
    U* o = out + r * nb;
    for (int64_t j = 0; j < nb; ++j) o[j] = op(ar[j], b[j]);
  }
}

}  // namespace

void add(const float* a, const float* b, float* out, int64_t n, int64_t nb) {
  binary(a, b, out, n, nb, [](float x, float y) { return x + y; });
}
void sub(const float* a, const float* b, float* out, int64_t n, int64_t nb) {
  binary(a, b, out, n, nb, [](float x, float y) { return x - y; });
}
void mul(const float* a, const float* b, float* out, int64_t n, int64_t nb) {
  binary(a, b, out, n, nb, [](float x, float y) { return x * y; });
}
void div(const float* a, const float* b, float* out, int64_t n, int64_t nb) {
  binary(a, b, out, n, nb, [](float x, float y) { return x / y; });
}

namespace {
template <typename T>
void compare_impl(const T* a, const T* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op) {
  binary(a, b, out, n, nb, [op](T x, T y) { return compare_values(x, y, op); });
}
}  // namespace

void compare(const float* a, const float* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op) {
  compare_impl(a, b, out, n, nb, op);
}
void compare(const int32_t* a, const int32_t* b, uint8_t* out, int64_t n, int64_t nb,
             CompareOp op) {
  compare_impl(a, b, out, n, nb, op);
}
void compare(const uint8_t* a, const uint8_t* b, uint8_t* out, int64_t n, int64_t nb,
             CompareOp op) {
  compare_impl(a, b, out, n, nb, op);
}
void compare(const int64_t* a, const int64_t* b, uint8_t* out, int64_t n, int64_t nb,
             CompareOp op) {
  compare_impl(a, b, out, n, nb, op);
}

void scale(const float* x, float s, float* out, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s;
}

void axpy(float* x, const float* y, float alpha, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) x[i] += alpha * y[i];
}

void sum_rows(const float* x, float* out, int64_t rows, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c) out[c] = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] += xr[c];
  }
}

double sum_of_squares(const float* x, int64_t n) {
  double total = 0.0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) total += double(x[i]) * double(x[i]);
  return total;
}

}  // namespace loom::kernels::cpu
