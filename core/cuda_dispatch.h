// How core reaches kernels/cuda: LOOM_IF_CUDA(call) compiles the call only when loom is built
// with CUDA (a CUDA tensor cannot exist otherwise, so the other branch is unreachable in
// practice and throws if reached). cuda_stream(device) makes the device current and returns the
// stream kernels run on: the device's compute stream (Note [Compute stream] in
// kernels/cuda/runtime.cpp).
#pragma once

#include <cstddef>
#include <initializer_list>

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

// Note [bf16 kernels on CUDA]
// Under Note [Low-precision compute] an op on bf16 tensors computes in f32 on upcast copies and
// rounds its result once. On CUDA the ops whose kernels have bf16 overloads (gelu, layer_norm,
// dropout, embedding, cross_entropy, attention; matmul and linear: Note [bf16 GEMMs on CUDA])
// call those instead: they read bf16, compute in f32 and round once on store, so the results are
// the same values without the f32 copies in memory. One exception is marked where it is made:
// attention's backward reads the bf16 output its forward stored (as FlashAttention does), where
// the f32 path keeps the unrounded output.
//
// True when `x` (the op's activation input) is bf16 on CUDA and every other defined tensor is
// bf16 or f32 on the same device: the op then takes its bf16 kernels.
inline bool cuda_bf16_path(const Tensor& x, std::initializer_list<const Tensor*> others = {}) {
  if (!x.defined() || !x.device().is_cuda() || x.dtype() != DType::kBF16) return false;
  for (const Tensor* t : others)
    if (t->defined() &&
        (t->device() != x.device() || (t->dtype() != DType::kBF16 && t->dtype() != DType::kF32)))
      return false;
  return true;
}

// Device scratch for a kernel that asks for a workspace: bytes from the caching allocator, freed
// when the returned tensor goes (stream order keeps that safe: Note [Caching allocator]).
inline Tensor cuda_workspace(Device device, size_t bytes) {
  return Tensor::empty({int64_t(bytes > 0 ? bytes : 1)}, DType::kU8, device);
}

}  // namespace loom
