#include "kernels/cpu/integer.h"

namespace loom::kernels::cpu {

namespace {

template <typename T>
void op_impl(const T* a, const T* b, T* out, int64_t n, int64_t nb, IntegerOp op) {
  for (int64_t i = 0; i < n; ++i) out[i] = integer_value(a[i], b[i % nb], op);
}

template <typename T>
void sum_impl(const T* x, int64_t* out, int64_t outer, int64_t size, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      uint64_t s = 0;  // unsigned: wrapping is defined
      for (int64_t k = 0; k < size; ++k) s += uint64_t(int64_t(x[(o * size + k) * inner + j]));
      out[o * inner + j] = int64_t(s);
    }
  }
}

}  // namespace

void integer_op(const int32_t* a, const int32_t* b, int32_t* out, int64_t n, int64_t nb,
                IntegerOp op) {
  op_impl(a, b, out, n, nb, op);
}
void integer_op(const int64_t* a, const int64_t* b, int64_t* out, int64_t n, int64_t nb,
                IntegerOp op) {
  op_impl(a, b, out, n, nb, op);
}
void integer_op(const uint8_t* a, const uint8_t* b, uint8_t* out, int64_t n, int64_t nb,
                IntegerOp op) {
  op_impl(a, b, out, n, nb, op);
}

void integer_sum(const int32_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner) {
  sum_impl(x, out, outer, size, inner);
}
void integer_sum(const int64_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner) {
  sum_impl(x, out, outer, size, inner);
}
void integer_sum(const uint8_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner) {
  sum_impl(x, out, outer, size, inner);
}

}  // namespace loom::kernels::cpu
