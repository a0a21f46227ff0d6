// GELU grid-stride kernels; the formula is kernels/cpu/gelu.h's, with the accurate expf rather
// than __expf so CPU and GPU agree to f32 rounding.
#include "kernels/cpu/gelu.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;

__device__ inline float sigmoid_of_2u(float x) { return 1.0f / (1.0f + expf(gelu_minus_2u(x))); }

__global__ void gelu_forward_kernel(const float* x, float* y, int64_t n) {
  LOOM_GRID_STRIDE(i, n)
  y[i] = x[i] * sigmoid_of_2u(x[i]);
}

__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx, int64_t n) {
  LOOM_GRID_STRIDE(i, n)
  dx[i] = dy[i] * gelu_derivative(x[i], sigmoid_of_2u(x[i]));
}

}  // namespace

void gelu_forward(const float* x, float* y, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(gelu_forward_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, y, n);
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(gelu_backward_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, dy, dx, n);
}

}  // namespace loom::kernels::cuda
