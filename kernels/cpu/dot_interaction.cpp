// The dot products accumulate in eight independent lanes combined in a fixed order, which GCC
// vectorises without -ffast-math and which gives the same bits whatever the thread count or the
// address of the rows (a library dot may peel an alignment prologue that depends on the address).
#include "kernels/cpu/dot_interaction.h"

#include <algorithm>

namespace loom::kernels::cpu {

namespace {

constexpr int kLanes = 8;

inline float dot(const float* a, const float* b, int64_t n) {
  float lane[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += a[d + l] * b[d + l];
  for (int l = 0; d < n; ++d, ++l) lane[l] += a[d] * b[d];
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

// Go parallel over samples only when there is enough work to pay for waking the threads.
inline bool worth_threads(int64_t batch, int64_t features, int64_t dim) {
  return batch > 1 && batch * features * features * dim > (1 << 18);
}

}  // namespace

void dot_interaction_forward(const float* x, float* out, int64_t batch, int64_t features,
                             int64_t dim) {
  const int64_t pairs = features * (features - 1) / 2;
#pragma omp parallel for schedule(static) if (worth_threads(batch, features, dim))
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = x + b * features * dim;
    float* o = out + b * pairs;
    for (int64_t i = 1; i < features; ++i)
      for (int64_t j = 0; j < i; ++j)
        o[dot_interaction_index(i, j)] = dot(xb + i * dim, xb + j * dim, dim);
  }
}

void dot_interaction_backward(const float* x, const float* dout, float* dx, int64_t batch,
                              int64_t features, int64_t dim) {
  const int64_t pairs = features * (features - 1) / 2;
#pragma omp parallel for schedule(static) if (worth_threads(batch, features, dim))
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = x + b * features * dim;
    const float* g = dout + b * pairs;
    float* dxb = dx + b * features * dim;
    std::fill(dxb, dxb + features * dim, 0.0f);
    for (int64_t i = 0; i < features; ++i) {
      float* di = dxb + i * dim;
      for (int64_t j = 0; j < features; ++j) {
        if (j == i) continue;
        const float w = g[i > j ? dot_interaction_index(i, j) : dot_interaction_index(j, i)];
        const float* xj = xb + j * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) di[d] += w * xj[d];
      }
    }
  }
}

}  // namespace loom::kernels::cpu
