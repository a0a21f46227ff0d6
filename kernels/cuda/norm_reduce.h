// Sums of squares and global-norm gradient clipping on device memory, with no host round trip:
// the CUDA side of cpu::sum_of_squares (kernels/cpu/elementwise.h) and of
// optim::clip_grad_norm's two halves (optimizer/clip_grad.h). Results land in device memory;
// every call only enqueues work on `stream`.
//
// Sums are accumulated in f64 in a fixed tree (per-thread strided sums over fixed 4096-element
// chunks, a shared-memory tree per chunk, then one block adds the chunk sums in order), so a
// result is bit-identical from run to run and does not depend on the GPU model. It differs from
// the CPU's sum, whose order depends on OpenMP's thread count, only by f64 rounding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

// Bytes of workspace sum_of_squares needs for n elements (0 for n == 0).
size_t sum_of_squares_workspace_bytes(int64_t n);

// *out = sum of x[i]^2 over [0, n), in f64 (out: one double in device memory; *out = 0 for
// n == 0). workspace: device memory of at least sum_of_squares_workspace_bytes(n) bytes, 8-byte
// aligned, not used by anything else until the sum is done.
void sum_of_squares(const float* x, int64_t n, double* out, void* workspace, size_t workspace_bytes,
                    Stream stream);

// Bytes of workspace sum_of_squares_multi needs for tensors of these sizes (a host array).
size_t sum_of_squares_multi_workspace_bytes(const int64_t* sizes, int64_t count);

// *out = sum over tensors t of the sum of tensors[t][i]^2, i < sizes[t], in f64, in one pass
// over the data (one reduction launch per kMaxTensorsPerLaunch tensors of optimizer_update.h,
// then one launch that adds the partial sums). tensors and sizes are host arrays of device
// pointers and element counts; size-0 tensors are skipped (their pointer may be null).
void sum_of_squares_multi(const float* const* tensors, const int64_t* sizes, int64_t count,
                          double* out, void* workspace, size_t workspace_bytes, Stream stream);

// Scales every tensor in place by coef = max_norm / (sqrt(*sum_sq) + 1e-6) when coef < 1,
// reading *sum_sq (one double in device memory, e.g. from sum_of_squares_multi) on the device:
// optim::scale_grads_to_norm's formula and rounding exactly (coef in f64, then x *= float(coef)),
// so clipping needs no host round trip. Nothing changes when coef >= 1 or sqrt(*sum_sq) is not
// finite (the caller may skip the step). max_norm must be > 0.
void clip_by_global_norm(float* const* tensors, const int64_t* sizes, int64_t count,
                         const double* sum_sq, double max_norm, Stream stream);

}  // namespace loom::kernels::cuda
