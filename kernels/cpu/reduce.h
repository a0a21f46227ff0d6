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

// values / indices [outer, k, inner]: the k first of x's column (o, i) in topk's order
// (kernels/extreme.h ranks_before), in that order. 1 <= k <= size.
void topk_dim(const float* x, float* values, int64_t* indices, int64_t outer, int64_t size,
              int64_t inner, int64_t k, bool largest);

// out (outer * size * inner, zeroed here) gets g[(o * k + j) * inner + i] at
// r = indices[(o * k + j) * inner + i] for j < k (distinct within a column): the gradient of
// extreme_dim's (k = 1) or topk_dim's values.
void scatter_dim(const float* g, const int64_t* indices, float* out, int64_t outer, int64_t size,
                 int64_t inner, int64_t k);

}  // namespace loom::kernels::cpu
