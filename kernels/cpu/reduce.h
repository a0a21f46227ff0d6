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

}  // namespace loom::kernels::cpu
