// The launch checks. The device limits are read once per device (cudaDeviceGetAttribute for the
// five that are checked; cudaGetDeviceProperties fills the whole struct and was a driver query
// per launch) and kept for the process, so a launch costs a cudaGetDevice and a table lookup.
#include <cstdlib>
#include <memory>
#include <mutex>

#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

struct DeviceLimits {
  int max_threads_per_block = 0;
  int max_grid[3] = {0, 0, 0};
  int max_shared_per_block_optin = 0;  // bytes
};

DeviceLimits query_limits(int device) {
  DeviceLimits l;
  LOOM_CUDA_CHECK(
      cudaDeviceGetAttribute(&l.max_threads_per_block, cudaDevAttrMaxThreadsPerBlock, device));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&l.max_grid[0], cudaDevAttrMaxGridDimX, device));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&l.max_grid[1], cudaDevAttrMaxGridDimY, device));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&l.max_grid[2], cudaDevAttrMaxGridDimZ, device));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&l.max_shared_per_block_optin,
                                         cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return l;
}

// The limits of `device`, queried on its first launch. The table is sized by the device count,
// which is fixed for the life of the process (CUDA_VISIBLE_DEVICES is read once, at the runtime's
// initialisation). Each entry is filled under its own once_flag: thread-safe, and a query that
// throws leaves the entry unfilled for the next launch to retry.
const DeviceLimits& limits_of(int device) {
  struct Entry {
    std::once_flag once;
    DeviceLimits limits;
  };
  static const int count = [] {
    int n = 0;
    LOOM_CUDA_CHECK(cudaGetDeviceCount(&n));
    return n;
  }();
  // Never freed: launches may run from static destructors, after this would be destroyed.
  static Entry* const entries = new Entry[size_t(count > 0 ? count : 1)];
  LOOM_ASSERT(device >= 0 && device < count, "current device ", device, " outside [0, ", count,
              ")");
  Entry& e = entries[device];
  std::call_once(e.once, [&] { e.limits = query_limits(device); });
  return e.limits;
}

}  // namespace

void check_launch_config(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  const DeviceLimits& limits = limits_of(device);
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  LOOM_CHECK(threads > 0 && threads <= uint64_t(limits.max_threads_per_block), "launch of ", kernel,
             ": block of ", threads, " threads (device limit ", limits.max_threads_per_block, ")");
  LOOM_CHECK(grid.x > 0 && grid.y > 0 && grid.z > 0 && grid.x <= unsigned(limits.max_grid[0]) &&
                 grid.y <= unsigned(limits.max_grid[1]) && grid.z <= unsigned(limits.max_grid[2]),
             "launch of ", kernel, ": grid (", grid.x, ", ", grid.y, ", ", grid.z,
             ") outside the device limits");
  LOOM_CHECK(shared_bytes <= size_t(limits.max_shared_per_block_optin), "launch of ", kernel, ": ",
             shared_bytes, " bytes of shared memory (device limit ",
             limits.max_shared_per_block_optin, ")");
}

// Note [Naming a faulting kernel]
// A kernel that faults (an illegal address, a trap) reports it asynchronously: the launch itself
// succeeds, and the error surfaces at some later CUDA call, which then carries the blame. With
// LOOM_CUDA_SYNC=1 in the environment every launch waits for its kernel, so the fault is reported
// by the launch that caused it, naming the kernel (the CUDA_LAUNCH_BLOCKING of loom's kernels;
// slow, for debugging).
bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_CUDA_SYNC");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return on;
}

void check_after_launch(const char* kernel) {
  cudaError_t err = cudaGetLastError();
  LOOM_CHECK(err == cudaSuccess, "launch of ", kernel, " failed: ", cudaGetErrorString(err));
  if (!sync_after_launch()) return;
  err = cudaDeviceSynchronize();
  LOOM_CHECK(err == cudaSuccess, "kernel ", kernel,
             " failed while running: ", cudaGetErrorString(err),
             " (reported at once because LOOM_CUDA_SYNC is set)");
}

}  // namespace loom::kernels::cuda
