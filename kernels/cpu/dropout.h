// Counter-based dropout. Element i is kept iff
//   philox::uniform01(philox::element_block(seed, stream, offset + i).v[0]) >= p
// (p compared as f32, as on the GPU) and kept elements are scaled by 1/(1-p). The mask is a pure
// function of (seed, stream, offset + i), so the backward applies the same call to the output
// gradient and no mask is stored.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// y = mask * x / (1 - p), for n elements. x == y is allowed.
void dropout(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
             uint64_t offset);

}  // namespace loom::kernels::cpu
