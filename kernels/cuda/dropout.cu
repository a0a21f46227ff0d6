// Dropout as a grid-stride loop, one Philox block per element (see kernels/cpu/philox.h, shared
// with the CPU), so the mask is a pure function of (seed, rng_stream, offset + i) and equals the
// CPU's bit for bit. The scale is computed on the host with the CPU's expression, and each kept
// element is one f32 multiply, so f32 outputs are bit-identical to the CPU's as well. Philox
// dominates the cost, so there is no vectorised variant.
#include "kernels/cpu/philox.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;

__device__ inline float to_f32(float v) { return v; }
__device__ inline float to_f32(BFloat16 v) { return bf16_to_float(v); }
__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(BFloat16* p, float v) { *p = float_to_bf16(v); }

// x == y is allowed: each element is read once, then written, by the same thread.
template <typename T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, float p, float scale, uint64_t seed,
                               uint64_t rng_stream, uint64_t offset) {
  LOOM_GRID_STRIDE(i, n) {
    const philox::Block b = philox::element_block(seed, rng_stream, offset + uint64_t(i));
    store(y + i, philox::uniform01(b.v[0]) >= p ? to_f32(x[i]) * scale : 0.0f);
  }
}

template <typename T>
void run(const T* x, T* y, int64_t n, float p, uint64_t seed, uint64_t rng_stream, uint64_t offset,
         Stream stream) {
  if (n == 0) return;
  const float scale = 1.0f / (1.0f - p);  // kernels/cpu/dropout.cpp's expression, in f32
  LOOM_LAUNCH(dropout_kernel<T>, grid_stride_blocks(n), kBlock, 0, stream, x, y, n, p, scale, seed,
              rng_stream, offset);
}

}  // namespace

void dropout(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t rng_stream,
             uint64_t offset, Stream stream) {
  run(x, y, n, p, seed, rng_stream, offset, stream);
}

void dropout(const BFloat16* x, BFloat16* y, int64_t n, float p, uint64_t seed, uint64_t rng_stream,
             uint64_t offset, Stream stream) {
  run(x, y, n, p, seed, rng_stream, offset, stream);
}

}  // namespace loom::kernels::cuda
