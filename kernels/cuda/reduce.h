// Sums over one dim of a contiguous f32 array viewed as [outer, size, inner], and their backward:
// the CUDA twins of kernels/cpu/reduce.h.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

// out[o * inner + i] = scale * sum over r < size of x[(o * size + r) * inner + i], accumulated in
// f64 in a fixed order (the result does not vary from run to run).
void sum_dim(const float* x, float* out, int64_t outer, int64_t size, int64_t inner, double scale,
             Stream stream);

// out[(o * size + r) * inner + i] = scale * g[o * inner + i].
void broadcast_dim(const float* g, float* out, int64_t outer, int64_t size, int64_t inner,
                   float scale, Stream stream);

// The twins of kernels/cpu/reduce.h's extreme_dim, topk_dim and scatter_dim (the same tie and
// NaN rules).
void extreme_dim(const float* x, float* values, int64_t* indices, int64_t outer, int64_t size,
                 int64_t inner, bool largest, Stream stream);
void topk_dim(const float* x, float* values, int64_t* indices, int64_t outer, int64_t size,
              int64_t inner, int64_t k, bool largest, Stream stream);
void scatter_dim(const float* g, const int64_t* indices, float* out, int64_t outer, int64_t size,
                 int64_t inner, int64_t k, Stream stream);

}  // namespace loom::kernels::cuda
