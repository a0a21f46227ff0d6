// ReLU grid-stride kernels (the CPU twin is kernels/cpu/relu.cpp): the same selects, so the two
// agree bit for bit.
#include "kernels/cuda/launch.h"
#include "kernels/cuda/relu.h"

namespace loom::kernels::cuda {

namespace {

__global__ void relu_forward_kernel(const float* x, float* y, int64_t n) {
  LOOM_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

__global__ void relu_backward_kernel(const float* x, const float* dy, float* dx, int64_t n) {
  LOOM_GRID_STRIDE(i, n) { dx[i] = x[i] > 0.0f ? dy[i] : 0.0f; }
}

}  // namespace

void relu_forward(const float* x, float* y, int64_t n, Stream stream) {
  LOOM_CHECK(n >= 0, "cuda relu_forward: n = ", n, " is negative");
  if (n == 0) return;
  LOOM_LAUNCH(relu_forward_kernel, grid_stride_blocks(n), kBlockThreads, 0, stream, x, y, n);
}

void relu_backward(const float* x, const float* dy, float* dx, int64_t n, Stream stream) {
  LOOM_CHECK(n >= 0, "cuda relu_backward: n = ", n, " is negative");
  if (n == 0) return;
  LOOM_LAUNCH(relu_backward_kernel, grid_stride_blocks(n), kBlockThreads, 0, stream, x, dy, dx, n);
}

}  // namespace loom::kernels::cuda
