#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;

template <int kOp>
__global__ void binary_kernel(const float* a, const float* b, float* out, int64_t n, int64_t nb) {
  LOOM_GRID_STRIDE(i, n) {
    float x = a[i], y = b[i % nb];
    out[i] = kOp == 0 ? x + y : (kOp == 1 ? x - y : (kOp == 2 ? x * y : x / y));
  }
}

template <typename T>
__global__ void compare_kernel(const T* a, const T* b, uint8_t* out, int64_t n, int64_t nb,
                               CompareOp op) {
  LOOM_GRID_STRIDE(i, n) out[i] = compare_values(a[i], b[i % nb], op);
}

template <typename T>
void compare_impl(const T* a, const T* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op,
                  Stream stream) {
  if (n == 0) return;
  LOOM_CHECK(nb > 0 && n % nb == 0, "cuda compare: broadcast size ", nb, " does not divide ", n);
  auto kernel = compare_kernel<T>;
  LOOM_LAUNCH(kernel, grid_stride_blocks(n), kBlock, 0, stream, a, b, out, n, nb, op);
}

__global__ void scale_kernel(const float* x, float s, float* out, int64_t n) {
  LOOM_GRID_STRIDE(i, n) out[i] = x[i] * s;
}

__global__ void axpy_kernel(float* x, const float* y, float alpha, int64_t n) {
  LOOM_GRID_STRIDE(i, n) x[i] += alpha * y[i];
}

// One thread per column; rows summed in order, so the result is deterministic.
__global__ void sum_rows_kernel(const float* x, float* out, int64_t rows, int64_t cols) {
  LOOM_GRID_STRIDE(c, cols) {
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r) acc += x[r * cols + c];
    out[c] = acc;
  }
}

template <int kOp>
void binary(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream) {
  if (n == 0) return;
  LOOM_CHECK(nb > 0 && n % nb == 0, "cuda binary op: broadcast size ", nb, " does not divide ", n);
  auto kernel = binary_kernel<kOp>;
  LOOM_LAUNCH(kernel, grid_stride_blocks(n), kBlock, 0, stream, a, b, out, n, nb);
}

}  // namespace

void add(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream) {
  binary<0>(a, b, out, n, nb, stream);
}
void sub(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream) {
  binary<1>(a, b, out, n, nb, stream);
}
void mul(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream) {
  binary<2>(a, b, out, n, nb, stream);
}
void div(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream) {
  binary<3>(a, b, out, n, nb, stream);  // IEEE division (nvcc's default -prec-div=true)
}

void compare(const float* a, const float* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op,
             Stream stream) {
  compare_impl(a, b, out, n, nb, op, stream);
}
void compare(const int32_t* a, const int32_t* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op,
             Stream stream) {
  compare_impl(a, b, out, n, nb, op, stream);
}
void compare(const int64_t* a, const int64_t* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op,
             Stream stream) {
  compare_impl(a, b, out, n, nb, op, stream);
}
void compare(const uint8_t* a, const uint8_t* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op,
             Stream stream) {
  compare_impl(a, b, out, n, nb, op, stream);
}

void scale(const float* x, float s, float* out, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(scale_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, s, out, n);
}

void axpy(float* x, const float* y, float alpha, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(axpy_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, y, alpha, n);
}

void sum_rows(const float* x, float* out, int64_t rows, int64_t cols, Stream stream) {
  if (cols == 0) return;
  LOOM_LAUNCH(sum_rows_kernel, grid_stride_blocks(cols), kBlock, 0, stream, x, out, rows, cols);
}

}  // namespace loom::kernels::cuda
