// GELU grid-stride kernels; the formula is kernels/cpu/gelu.h's, with the accurate expf rather
// than __expf so CPU and GPU agree to f32 rounding. One template serves f32 and bf16: elements
// are read into f32 and the result rounded once on store (loom's round-to-nearest-even).
#include "kernels/cpu/gelu.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;

__device__ inline float to_f32(float v) { return v; }
__device__ inline float to_f32(BFloat16 v) { return bf16_to_float(v); }
__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(BFloat16* p, float v) { *p = float_to_bf16(v); }

__device__ inline float sigmoid_of_2u(float x) { return 1.0f / (1.0f + expf(gelu_minus_2u(x))); }

template <typename T>
__global__ void gelu_forward_kernel(const T* x, T* y, int64_t n) {
  LOOM_GRID_STRIDE(i, n) {
    const float v = to_f32(x[i]);
    store(y + i, v * sigmoid_of_2u(v));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, int64_t n) {
  LOOM_GRID_STRIDE(i, n) {
    const float v = to_f32(x[i]);
    store(dx + i, to_f32(dy[i]) * gelu_derivative(v, sigmoid_of_2u(v)));
  }
}

template <typename T>
void forward(const T* x, T* y, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(gelu_forward_kernel<T>, grid_stride_blocks(n), kBlock, 0, stream, x, y, n);
}

template <typename T>
void backward(const T* x, const T* dy, T* dx, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(gelu_backward_kernel<T>, grid_stride_blocks(n), kBlock, 0, stream, x, dy, dx, n);
}

}  // namespace

void gelu_forward(const float* x, float* y, int64_t n, Stream stream) { forward(x, y, n, stream); }
void gelu_forward(const BFloat16* x, BFloat16* y, int64_t n, Stream stream) {
  forward(x, y, n, stream);
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, Stream stream) {
  backward(x, dy, dx, n, stream);
}
void gelu_backward(const BFloat16* x, const BFloat16* dy, BFloat16* dx, int64_t n, Stream stream) {
  backward(x, dy, dx, n, stream);
}

}  // namespace loom::kernels::cuda
