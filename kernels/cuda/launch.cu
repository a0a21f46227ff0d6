#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

void check_launch_config(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  LOOM_CHECK(threads > 0 && threads <= uint64_t(prop.maxThreadsPerBlock), "launch of ", kernel,
             ": block of ", threads, " threads (device limit ", prop.maxThreadsPerBlock, ")");
  LOOM_CHECK(grid.x > 0 && grid.y > 0 && grid.z > 0 && grid.x <= unsigned(prop.maxGridSize[0]) &&
                 grid.y <= unsigned(prop.maxGridSize[1]) && grid.z <= unsigned(prop.maxGridSize[2]),
             "launch of ", kernel, ": grid (", grid.x, ", ", grid.y, ", ", grid.z,
             ") outside the device limits");
  LOOM_CHECK(shared_bytes <= prop.sharedMemPerBlockOptin, "launch of ", kernel, ": ", shared_bytes,
             " bytes of shared memory (device limit ", prop.sharedMemPerBlockOptin, ")");
}

void check_after_launch(const char* kernel) {
  cudaError_t err = cudaGetLastError();
  LOOM_CHECK(err == cudaSuccess, "launch of ", kernel, " failed: ", cudaGetErrorString(err));
}

}  // namespace loom::kernels::cuda
