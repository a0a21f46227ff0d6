// The one way loom launches a kernel: the grid and block are checked against the device's
// limits before the launch and cudaGetLastError after it, and every error names the kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/check.h"

namespace loom::kernels::cuda {

// Blocks needed to cover n items with `block` threads each.
inline unsigned blocks_for(int64_t n, int block) { return unsigned((n + block - 1) / block); }

void check_launch_config(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes);
void check_after_launch(const char* kernel);

}  // namespace loom::kernels::cuda

// LOOM_LAUNCH(kernel, grid, block, shared_bytes, stream, args...)
#define LOOM_LAUNCH(kernel, grid, block, shared, stream, ...)                             \
  do {                                                                                    \
    ::loom::kernels::cuda::check_launch_config(#kernel, dim3(grid), dim3(block), shared); \
    kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__);                         \
    ::loom::kernels::cuda::check_after_launch(#kernel);                                   \
  } while (0)
