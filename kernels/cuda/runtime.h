// The CUDA runtime calls core needs (device memory, copies, device count), behind plain
// functions so core compiles the same with and without CUDA. Built from runtime.cpp when
// LOOM_WITH_CUDA is on, and from runtime_stub.cpp (every call but the queries throws) otherwise.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/cuda/stream.h"

namespace loom::cuda_rt {

bool built_with_cuda();
int device_count();           // 0 when built without CUDA or when no GPU is usable; never throws
std::string no_gpu_reason();  // why device_count() is 0, for skip messages
std::string device_name(int device);  // "NVIDIA H100 80GB HBM3"; throws without CUDA

void* malloc_device(int device, size_t nbytes);
// nullptr when the device is out of memory (the error is cleared); other failures throw.
void* try_malloc_device(int device, size_t nbytes);
size_t device_free_bytes(int device);  // cudaMemGetInfo's free bytes
void free_device(int device, void* ptr);
void copy_host_to_device(int device, void* dst, const void* src, size_t nbytes);
void copy_device_to_host(int device, void* dst, const void* src, size_t nbytes);
void copy_device_to_device(int device, void* dst, const void* src, size_t nbytes);
void memset_device(int device, void* dst, int value, size_t nbytes);
void synchronize(int device);
// The stream every loom kernel of `device` runs on (Note [Compute stream] in runtime.cpp): created
// on first use, kept for the process. Makes `device` current.
kernels::cuda::Stream compute_stream(int device);
void set_device(int device);
// One GPU per rank (NCCL refuses two ranks on one GPU): makes GPU `local_rank` current for the
// rank with that index among the ranks of its node, and returns it. loom::Error when the node has
// no such GPU, naming both numbers. Launchers say what the local rank is, not the GPU layer;
// see collectives/nccl_backend.cpp.
int select_device_for_local_rank(int local_rank);
// height rows of width bytes, rows dst_pitch / src_pitch bytes apart, on the current device.
void copy_2d_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                    size_t height);

}  // namespace loom::cuda_rt
