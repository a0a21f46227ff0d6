// Sums over one dim of a contiguous f32 array viewed as [outer, size, inner], and the broadcast
// that is their backward. A sum over all elements is outer = inner = 1.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// out[o * inner + i] = scale * sum over r < size of x[(o * size + r) * inner + i], accumulated in
// f64 so long sums keep f32 accuracy. scale = 1 gives sum, 1 / size gives mean.
void sum_dim(const float* x, float* out, int64_t outer, int64_t size, int64_t inner, double scale);

// out[(o * size + r) * inner + i] = scale * g[o * inner + i]: the gradient of sum_dim.
void broadcast_dim(const float* g, float* out, int64_t outer, int64_t size, int64_t inner,
                   float scale);

// values[o * inner + i] = the largest (largest = true) or smallest x[(o * size + r) * inner + i]
// over r, indices[...] = its r: the first among equals; a NaN wins (the first NaN), as PyTorch.
// size >= 1.
void extreme_dim(const float* x, float* values, int64_t* indices, int64_t outer, int64_t size,
                 int64_t inner, bool largest);

// out (outer * size * inner, zeroed here) gets g[o * inner + i] at r = indices[o * inner + i]:
// the gradient of extreme_dim's values.
void scatter_dim(const float* g, const int64_t* indices, float* out, int64_t outer, int64_t size,
                 int64_t inner);

}  // namespace loom::kernels::cpu
