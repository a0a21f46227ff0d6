// The rule of max / min along a dim (kernels/cpu/reduce.h extreme_dim and its CUDA twin): one
// definition for both sides. PyTorch's: the first index among equal extremes, and a NaN is the
// extreme (the first NaN, once met, is kept).
#pragma once

#if defined(__CUDACC__)
#define LOOM_EXTREME_HD __host__ __device__
#else
#define LOOM_EXTREME_HD
#endif

namespace loom::kernels {

// Whether candidate v replaces the best so far.
LOOM_EXTREME_HD inline bool replaces(float v, float best, bool largest) {
  if (best != best) return false;  // a NaN already chosen stays
  if (v != v) return true;
  return largest ? v > best : v < best;
}

}  // namespace loom::kernels
