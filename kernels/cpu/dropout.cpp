// One Philox block per element (only its first word is used) keeps element i independent of how
// the tensor is split; see kernels/cpu/philox.h.
#include "kernels/cpu/dropout.h"

#include "kernels/cpu/philox.h"

namespace loom::kernels::cpu {

void dropout(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
             uint64_t offset) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {
    const philox::Block b = philox::element_block(seed, stream, offset + uint64_t(i));
    y[i] = philox::uniform01(b.v[0]) >= p ? x[i] * scale : 0.0f;
  }
}

}  // namespace loom::kernels::cpu
