// How core reaches kernels/cuda: LOOM_IF_CUDA(call) compiles the call only when loom is built
// with CUDA (a CUDA tensor cannot exist otherwise, so the other branch is unreachable in
// practice and throws if reached). cuda_stream(device) makes the device current and returns the
// stream kernels run on: the device's compute stream (Note [Compute stream] in
// kernels/cuda/runtime.cpp).
#pragma once

#include <cstddef>

#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"

#if LOOM_WITH_CUDA
#define LOOM_IF_CUDA(...) __VA_ARGS__
#else
#define LOOM_IF_CUDA(...) LOOM_FAIL("loom was built without CUDA")
#endif

namespace loom {

inline kernels::cuda::Stream cuda_stream(Device device) {
  return cuda_rt::compute_stream(device.index);
}

// Device scratch for a kernel that asks for a workspace: bytes from the caching allocator, freed
// when the returned tensor goes (stream order keeps that safe: Note [Caching allocator]).
inline Tensor cuda_workspace(Device device, size_t bytes) {
  return Tensor::empty({int64_t(bytes > 0 ? bytes : 1)}, DType::kU8, device);
}

}  // namespace loom
