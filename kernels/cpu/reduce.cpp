// f64 accumulation rather than pairwise f32: summing a million f32 values one by one in f32 loses
// about three digits, in f64 none that survive the final rounding to f32, and the cost is the
// same memory-bound pass. The order of additions is fixed (no thread count dependence).
#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/extreme.h"

namespace loom::kernels::cpu {

namespace {

double sum_contiguous(const float* x, int64_t n) {
  double total = 0.0;
  // omp simd lets the compiler keep several partial sums (a fixed, compile-time order).
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) total += double(x[i]);
  return total;
}

}  // namespace

void sum_dim(const float* x, float* out, int64_t outer, int64_t size, int64_t inner, double scale) {
  if (outer == 0 || inner == 0) return;
  if (inner == 1) {
#pragma omp parallel for schedule(static) if (outer * size > (1 << 16) && outer > 1)
    for (int64_t o = 0; o < outer; ++o) out[o] = float(sum_contiguous(x + o * size, size) * scale);
    return;
  }
  // Rows of `inner` contiguous values are added into an f64 row, which vectorises.
#pragma omp parallel for schedule(static) if (outer * size * inner > (1 << 16) && outer > 1)
  for (int64_t o = 0; o < outer; ++o) {
    std::vector<double> acc(std::size_t(inner), 0.0);
    const float* xo = x + o * size * inner;
    for (int64_t r = 0; r < size; ++r) {
      const float* row = xo + r * inner;
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) acc[std::size_t(i)] += double(row[i]);
    }
    float* oo = out + o * inner;
    for (int64_t i = 0; i < inner; ++i) oo[i] = float(acc[std::size_t(i)] * scale);
  }
}

void broadcast_dim(const float* g, float* out, int64_t outer, int64_t size, int64_t inner,
                   float scale) {
#pragma omp parallel for schedule(static) if (outer * size * inner > (1 << 16) && outer > 1)
  for (int64_t o = 0; o < outer; ++o) {
    const float* go = g + o * inner;
    for (int64_t r = 0; r < size; ++r) {
      float* row = out + (o * size + r) * inner;
      for (int64_t i = 0; i < inner; ++i) row[i] = go[i] * scale;
    }
  }
}

void extreme_dim(const float* x, float* values, int64_t* indices, int64_t outer, int64_t size,
                 int64_t inner, bool largest) {
#pragma omp parallel for schedule(static) if (outer * size * inner > (1 << 16) && outer > 1)
  for (int64_t o = 0; o < outer; ++o) {
    const float* xo = x + o * size * inner;
    float* vo = values + o * inner;
    int64_t* io = indices + o * inner;
    for (int64_t i = 0; i < inner; ++i) {
      vo[i] = xo[i];
      io[i] = 0;
    }
    for (int64_t r = 1; r < size; ++r) {
      const float* row = xo + r * inner;
      for (int64_t i = 0; i < inner; ++i)
        if (replaces(row[i], vo[i], largest)) {
          vo[i] = row[i];
          io[i] = r;
        }
    }
  }
}

void topk_dim(const float* x, float* values, int64_t* indices, int64_t outer, int64_t size,
              int64_t inner, int64_t k, bool largest) {
#pragma omp parallel for schedule(static) if (outer * size * inner > (1 << 16) && outer * inner > 1)
  for (int64_t column = 0; column < outer * inner; ++column) {
    const int64_t o = column / inner, i = column % inner;
    const float* xs = x + o * size * inner + i;  // the column: xs[r * inner]
    std::vector<int64_t> order(size_t(size), 0);
    std::iota(order.begin(), order.end(), int64_t(0));
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
      return ranks_before(xs[a * inner], a, xs[b * inner], b, largest);
    });
    for (int64_t j = 0; j < k; ++j) {
      values[(o * k + j) * inner + i] = xs[order[size_t(j)] * inner];
      indices[(o * k + j) * inner + i] = order[size_t(j)];
    }
  }
}

void scatter_dim(const float* g, const int64_t* indices, float* out, int64_t outer, int64_t size,
                 int64_t inner, int64_t k) {
  std::memset(out, 0, size_t(outer * size * inner) * sizeof(float));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t at = (o * k + j) * inner + i;
        out[(o * size + indices[at]) * inner + i] = g[at];
      }
}

}  // namespace loom::kernels::cpu
