// Sigmoid grid-stride kernels (the CPU twin is kernels/cpu/sigmoid.cpp, which explains why
// 1 / (1 + exp(-x)) needs no case split in f32). The accurate expf, not __expf, and an IEEE
// division (nvcc's default -prec-div=true), so CPU and GPU agree to f32 rounding.
#include "kernels/cuda/launch.h"
#include "kernels/cuda/sigmoid.h"

namespace loom::kernels::cuda {

namespace {

__global__ void sigmoid_forward_kernel(const float* x, float* y, int64_t n) {
  LOOM_GRID_STRIDE(i, n) { y[i] = 1.0f / (1.0f + expf(-x[i])); }
}

__global__ void sigmoid_backward_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  // (dy * y) * (1 - y) as the CPU evaluates it; no add follows a multiply, so there is nothing
  // for FMA contraction to fuse.
  LOOM_GRID_STRIDE(i, n) {
    const float v = y[i];
    dx[i] = dy[i] * v * (1.0f - v);
  }
}

}  // namespace

void sigmoid_forward(const float* x, float* y, int64_t n, Stream stream) {
  LOOM_CHECK(n >= 0, "cuda sigmoid_forward: n = ", n, " is negative");
  if (n == 0) return;
  LOOM_LAUNCH(sigmoid_forward_kernel, grid_stride_blocks(n), kBlockThreads, 0, stream, x, y, n);
}

void sigmoid_backward(const float* y, const float* dy, float* dx, int64_t n, Stream stream) {
  LOOM_CHECK(n >= 0, "cuda sigmoid_backward: n = ", n, " is negative");
  if (n == 0) return;
  LOOM_LAUNCH(sigmoid_backward_kernel, grid_stride_blocks(n), kBlockThreads, 0, stream, y, dy, dx,
              n);
}

}  // namespace loom::kernels::cuda
