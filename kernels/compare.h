// The comparisons of the elementwise compare kernels (kernels/cpu/elementwise.h and their CUDA
// twins): one list for both, so the two sides cannot disagree on what a code means.
#pragma once

#include <cstdint>

namespace loom::kernels {

enum class CompareOp : int { kEq, kNe, kLt, kLe, kGt, kGe };

// x op y as 1 or 0. NaN compares unequal to everything, itself included (IEEE, as PyTorch).
template <typename T>
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline uint8_t
    compare_values(T x, T y, CompareOp op) {
  switch (op) {
    case CompareOp::kEq:
      return x == y;
    case CompareOp::kNe:
      return x != y;
    case CompareOp::kLt:
      return x < y;
    case CompareOp::kLe:
      return x <= y;
    case CompareOp::kGt:
      return x > y;
    case CompareOp::kGe:
      return x >= y;
  }
  return 0;
}

}  // namespace loom::kernels
