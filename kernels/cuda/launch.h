// The one way loom launches a kernel: the grid and block are checked against the device's
// limits before the launch and cudaGetLastError after it, and every error names the kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/check.h"

namespace loom::kernels::cuda {

// Blocks needed to cover n items with `block` threads each.
inline unsigned blocks_for(int64_t n, int block) { return unsigned((n + block - 1) / block); }

// The block size of loom's elementwise-style kernels, and the grid of a grid-stride loop over n
// items: enough blocks to cover n, at least 1, at most kMaxGridBlocks (the loop covers the rest).
constexpr int kBlockThreads = 256;
constexpr unsigned kMaxGridBlocks = 65535;
inline unsigned grid_stride_blocks(int64_t n, int block = kBlockThreads) {
  const int64_t b = (n + block - 1) / block;
  return unsigned(b < 1 ? 1 : (b < int64_t(kMaxGridBlocks) ? b : kMaxGridBlocks));
}

void check_launch_config(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes);
void check_after_launch(const char* kernel);

}  // namespace loom::kernels::cuda

// A grid-stride loop: `i` visits every index in [0, n) whatever the grid size.
#define LOOM_GRID_STRIDE(i, n)                                              \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// LOOM_LAUNCH(kernel, grid, block, shared_bytes, stream, args...)
#define LOOM_LAUNCH(kernel, grid, block, shared, stream, ...)                             \
  do {                                                                                    \
    ::loom::kernels::cuda::check_launch_config(#kernel, dim3(grid), dim3(block), shared); \
    kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__);                         \
    ::loom::kernels::cuda::check_after_launch(#kernel);                                   \
  } while (0)
