// The rules of max / min and topk along a dim (kernels/cpu/reduce.h extreme_dim, topk_dim and
// their CUDA twins): one definition for both sides. max / min are PyTorch's: the first index
// among equal extremes, and a NaN is the extreme (the first NaN, once met, is kept).
#pragma once

#include <cstdint>

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

// topk's order, a strict total order on (value, index): the larger (largest) or smaller value
// first; NaN counts as larger than every number, as in PyTorch's topk (first when largest, last
// otherwise); equal values (and NaNs among themselves) by lower index first, so the result is
// deterministic where PyTorch leaves the order of ties unspecified.
LOOM_EXTREME_HD inline bool ranks_before(float a, int64_t ia, float b, int64_t ib, bool largest) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan || b_nan) {
    if (a_nan && b_nan) return ia < ib;
    return largest ? a_nan : b_nan;
  }
  if (a != b) return largest ? a > b : a < b;
  return ia < ib;
}

}  // namespace loom::kernels
