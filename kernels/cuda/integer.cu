#include "kernels/cuda/integer.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

template <typename T>
__global__ void integer_op_kernel(const T* a, const T* b, T* out, int64_t n, int64_t nb,
                                  IntegerOp op) {
  LOOM_GRID_STRIDE(i, n) out[i] = integer_value(a[i], b[i % nb], op);
}

template <typename T>
void op_impl(const T* a, const T* b, T* out, int64_t n, int64_t nb, IntegerOp op, Stream stream) {
  if (n == 0) return;
  LOOM_CHECK(nb > 0 && n % nb == 0, "cuda integer_op: broadcast size ", nb, " does not divide ", n);
  auto kernel = integer_op_kernel<T>;
  LOOM_LAUNCH(kernel, grid_stride_blocks(n), kBlockThreads, 0, stream, a, b, out, n, nb, op);
}

__global__ void zero_kernel(int64_t* out, int64_t n) { LOOM_GRID_STRIDE(i, n) out[i] = 0; }

// Each element adds into its output with a 64-bit atomic (exact: the bits of a two's-complement
// sum do not depend on the order).
template <typename T>
__global__ void integer_sum_kernel(const T* x, int64_t* out, int64_t n, int64_t size,
                                   int64_t inner) {
  LOOM_GRID_STRIDE(i, n) {
    const int64_t o = (i / (size * inner)) * inner + i % inner;
    atomicAdd(reinterpret_cast<unsigned long long*>(out + o),
              static_cast<unsigned long long>(static_cast<int64_t>(x[i])));
  }
}

template <typename T>
void sum_impl(const T* x, int64_t* out, int64_t outer, int64_t size, int64_t inner, Stream stream) {
  const int64_t outputs = outer * inner, n = outputs * size;
  if (outputs == 0) return;
  LOOM_LAUNCH(zero_kernel, grid_stride_blocks(outputs), kBlockThreads, 0, stream, out, outputs);
  if (n == 0) return;
  auto kernel = integer_sum_kernel<T>;
  LOOM_LAUNCH(kernel, grid_stride_blocks(n), kBlockThreads, 0, stream, x, out, n, size, inner);
}

}  // namespace

void integer_op(const int32_t* a, const int32_t* b, int32_t* out, int64_t n, int64_t nb,
                IntegerOp op, Stream stream) {
  op_impl(a, b, out, n, nb, op, stream);
}
void integer_op(const int64_t* a, const int64_t* b, int64_t* out, int64_t n, int64_t nb,
                IntegerOp op, Stream stream) {
  op_impl(a, b, out, n, nb, op, stream);
}
void integer_op(const uint8_t* a, const uint8_t* b, uint8_t* out, int64_t n, int64_t nb,
                IntegerOp op, Stream stream) {
  op_impl(a, b, out, n, nb, op, stream);
}

void integer_sum(const int32_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner,
                 Stream stream) {
  sum_impl(x, out, outer, size, inner, stream);
}
void integer_sum(const int64_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner,
                 Stream stream) {
  sum_impl(x, out, outer, size, inner, stream);
}
void integer_sum(const uint8_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner,
                 Stream stream) {
  sum_impl(x, out, outer, size, inner, stream);
}

}  // namespace loom::kernels::cuda
