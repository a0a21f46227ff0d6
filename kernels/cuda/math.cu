#include "kernels/cuda/launch.h"
#include "kernels/cuda/math.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;

__global__ void unary_kernel(const float* x, float* y, int64_t n, UnaryOp op) {
  LOOM_GRID_STRIDE(i, n) y[i] = unary_value(x[i], op);
}

__global__ void unary_backward_kernel(const float* x, const float* y, const float* dy, float* dx,
                                      int64_t n, UnaryOp op) {
  LOOM_GRID_STRIDE(i, n) dx[i] = unary_grad(x[i], y[i], dy[i], op);
}

__global__ void pow_kernel(const float* x, float e, float* y, int64_t n) {
  LOOM_GRID_STRIDE(i, n) y[i] = pow_value(x[i], e);
}

__global__ void pow_backward_kernel(const float* x, float e, const float* dy, float* dx,
                                    int64_t n) {
  LOOM_GRID_STRIDE(i, n) dx[i] = pow_grad(x[i], e, dy[i]);
}

__global__ void clamp_kernel(const float* x, float lo, float hi, float* y, int64_t n) {
  LOOM_GRID_STRIDE(i, n) y[i] = clamp_value(x[i], lo, hi);
}

__global__ void clamp_backward_kernel(const float* x, float lo, float hi, const float* dy,
                                      float* dx, int64_t n) {
  LOOM_GRID_STRIDE(i, n) dx[i] = clamp_grad(x[i], lo, hi, dy[i]);
}

__global__ void select_kernel(const uint8_t* condition, const float* a, const float* b, float* out,
                              int64_t n) {
  LOOM_GRID_STRIDE(i, n) out[i] = condition[i] ? a[i] : b[i];
}

}  // namespace

void unary(const float* x, float* y, int64_t n, UnaryOp op, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(unary_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, y, n, op);
}

void unary_backward(const float* x, const float* y, const float* dy, float* dx, int64_t n,
                    UnaryOp op, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(unary_backward_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, y, dy, dx, n, op);
}

void pow(const float* x, float e, float* y, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(pow_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, e, y, n);
}

void pow_backward(const float* x, float e, const float* dy, float* dx, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(pow_backward_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, e, dy, dx, n);
}

void clamp(const float* x, float lo, float hi, float* y, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(clamp_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, lo, hi, y, n);
}

void clamp_backward(const float* x, float lo, float hi, const float* dy, float* dx, int64_t n,
                    Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(clamp_backward_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, lo, hi, dy, dx,
              n);
}

void select(const uint8_t* condition, const float* a, const float* b, float* out, int64_t n,
            Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(select_kernel, grid_stride_blocks(n), kBlock, 0, stream, condition, a, b, out, n);
}

}  // namespace loom::kernels::cuda
