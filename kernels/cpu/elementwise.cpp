#include "kernels/cpu/elementwise.h"

#include <vector>

namespace loom::kernels::cpu {

namespace {

// The broadcast operand repeats every nb elements, so walk a in rows of nb: the inner loop is a
// plain vectorisable loop over two contiguous arrays.
template <typename Op>
void binary(const float* a, const float* b, float* out, int64_t n, int64_t nb, Op op) {
  const int64_t rows = nb > 0 ? n / nb : 0;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * nb;
    float* o = out + r * nb;
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
