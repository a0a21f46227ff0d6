// GELU grid-stride kernels; the formula is kernels/cpu/gelu.h's, with the accurate expf rather
// than __expf so CPU and GPU agree to f32 rounding.
#include "kernels/cpu/gelu.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = 256;

unsigned capped_blocks(int64_t n) {
  int64_t b = (n + kBlock - 1) / kBlock;
  return unsigned(b < 1 ? 1 : (b < 65535 ? b : 65535));
}

__device__ inline float sigmoid_of_2u(float x) { return 1.0f / (1.0f + expf(gelu_minus_2u(x))); }

__global__ void gelu_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i] * sigmoid_of_2u(x[i]);
}

__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = dy[i] * gelu_derivative(x[i], sigmoid_of_2u(x[i]));
}

}  // namespace

void gelu_forward(const float* x, float* y, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(gelu_forward_kernel, capped_blocks(n), kBlock, 0, stream, x, y, n);
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(gelu_backward_kernel, capped_blocks(n), kBlock, 0, stream, x, dy, dx, n);
}

}  // namespace loom::kernels::cuda
