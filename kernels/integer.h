// Integer arithmetic of the integer kernels (kernels/cpu/integer.h and their CUDA twins): one
// definition for both sides. As PyTorch's integer tensors: add, sub and mul wrap around in the
// type's width (two's complement; computed in the unsigned type, where C++ defines wrapping);
// floor division and the remainder follow Python's // and % (the quotient rounds toward minus
// infinity, the remainder takes the divisor's sign). A zero divisor never reaches these: the op
// refuses it first.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define LOOM_INT_HD __host__ __device__
#else
#define LOOM_INT_HD
#endif

namespace loom::kernels {

enum class IntegerOp : int { kAdd, kSub, kMul, kFloorDiv, kRemainder };

template <typename T>
LOOM_INT_HD inline T integer_value(T a, T b, IntegerOp op) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case IntegerOp::kAdd:
      return T(U(U(a) + U(b)));
    case IntegerOp::kSub:
      return T(U(U(a) - U(b)));
    case IntegerOp::kMul:
      return T(U(U(a) * U(b)));
    case IntegerOp::kFloorDiv: {
      if constexpr (std::is_signed_v<T>) {
        if (b == T(-1)) return T(U(0) - U(a));  // the one quotient that overflows: wraps
        const T q = T(a / b);
        return (a % b != 0 && ((a < 0) != (b < 0))) ? T(q - 1) : q;
      } else {
        return T(a / b);
      }
    }
    case IntegerOp::kRemainder: {
      if constexpr (std::is_signed_v<T>) {
        if (b == T(-1)) return T(0);
        const T r = T(a % b);
        return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r;
      } else {
        return T(a % b);
      }
    }
  }
  return T(0);
}

}  // namespace loom::kernels
