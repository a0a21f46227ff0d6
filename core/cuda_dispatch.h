// How core reaches kernels/cuda: LOOM_IF_CUDA(call) compiles the call only when loom is built
// with CUDA (a CUDA tensor cannot exist otherwise, so the other branch is unreachable in
// practice and throws if reached). cuda_stream(device) makes the device current and returns the
// stream kernels run on: the default stream until the CUDA backend issue adds per-device
// compute and communication streams.
#pragma once

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"

#if LOOM_WITH_CUDA
#define LOOM_IF_CUDA(...) __VA_ARGS__
#else
#define LOOM_IF_CUDA(...) LOOM_FAIL("loom was built without CUDA")
#endif

namespace loom {

inline kernels::cuda::Stream cuda_stream(Device device) {
  cuda_rt::set_device(device.index);
  return nullptr;
}

}  // namespace loom
