#include "kernels/cuda/runtime.h"

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "kernels/cuda/check.h"

namespace loom::cuda_rt {

bool built_with_cuda() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string no_gpu_reason() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: ") + cudaGetErrorString(err);
  }
  return n == 0 ? "no CUDA device present" : "";
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

void* malloc_device(int device, size_t nbytes) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&p, nbytes));
  return p;
}

void* try_malloc_device(int device, size_t nbytes) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, nbytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it: the caller frees its cache and retries
    return nullptr;
  }
  LOOM_CUDA_CHECK(err);
  return p;
}

size_t device_free_bytes(int device) {
  size_t free = 0, total = 0;
  if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return free;
}

void free_device(int device, void* ptr) {
  cudaSetDevice(device);
  cudaFree(ptr);  // never throws from a destructor path
}

void copy_host_to_device(int device, void* dst, const void* src, size_t nbytes) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  LOOM_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice));
}

void copy_device_to_host(int device, void* dst, const void* src, size_t nbytes) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  LOOM_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost));
}

void copy_device_to_device(int device, void* dst, const void* src, size_t nbytes) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  LOOM_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToDevice));
}

void memset_device(int device, void* dst, int value, size_t nbytes) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  LOOM_CUDA_CHECK(cudaMemset(dst, value, nbytes));
}

void synchronize(int device) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
}

void set_device(int device) { LOOM_CUDA_CHECK(cudaSetDevice(device)); }

// Note [Compute stream]
// Every loom kernel, cuBLAS call and stream-ordered copy of a device goes on one compute stream of
// that device, so kernels are ordered among themselves and the caching allocator may hand a freed
// block straight to the next request (Note [Caching allocator]). The stream is created blocking
// (cudaStreamDefault): work on the legacy default stream (cudaMemcpy in this file, third-party
// code) waits for it and it for them, so host copies need no extra events. Communication runs on
// streams of its own, ordered against this one by events (Note [NCCL streams]).
kernels::cuda::Stream compute_stream(int device) {
  static std::mutex mutex;
  static std::vector<cudaStream_t> streams;
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  std::lock_guard<std::mutex> lock(mutex);
  if (streams.size() <= size_t(device)) streams.resize(size_t(device) + 1, nullptr);
  if (streams[size_t(device)] == nullptr)
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[size_t(device)], cudaStreamDefault));
  return streams[size_t(device)];
}

int select_device_for_local_rank(int local_rank) {
  const int n = device_count();
  LOOM_CHECK(local_rank >= 0 && local_rank < n, "local rank ", local_rank,
             " needs a GPU of its own but this node has only ", n,
             n == 0 ? " (" + no_gpu_reason() + ")" : "",
             " (use backend mpi for host staging, or fewer ranks per node)");
  LOOM_CUDA_CHECK(cudaSetDevice(local_rank));
  return local_rank;
}

void copy_2d_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                    size_t height) {
  if (width == 0 || height == 0) return;
  LOOM_CUDA_CHECK(
      cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice));
}

}  // namespace loom::cuda_rt
