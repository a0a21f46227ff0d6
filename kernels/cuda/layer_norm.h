// Layer normalisation over the last dim of a contiguous [rows, cols] array on device memory: the
// CUDA twins of kernels/cpu/layer_norm.h, for f32 and bf16 activations (x, y, dy, dx). weight,
// bias, mean, rstd, dweight and dbias are f32 in both; bf16 is read into f32, computed in f32 and
// rounded once on store.
//
// Where this differs from the CPU interface, and why: the parameter gradients sum over rows in a
// fixed order through per-chunk partial sums, and the partials need device scratch. Ask
// layer_norm_backward_workspace_bytes and pass at least that many bytes (no allocation, no host
// synchronisation inside). dweight and dbias are bit-identical from run to run on one GPU and
// equal the CPU's to f32 rounding (the order of additions differs).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda {

// weight and bias [cols] may be null (scale 1 / shift 0). mean and rstd [rows] get (=) the
// row's mean and 1 / sqrt(biased variance + eps); they must not be null. y == x is allowed.
void layer_norm_forward(const float* x, const float* weight, const float* bias, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                        Stream stream);
void layer_norm_forward(const BFloat16* x, const float* weight, const float* bias, BFloat16* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                        Stream stream);

// Device scratch the backward needs when dweight or dbias is wanted (0 when rows == 0).
size_t layer_norm_backward_workspace_bytes(int64_t rows, int64_t cols);

// Writes (=, not +=) each non-null output: dx [rows, cols], dweight and dbias [cols] (zeros when
// rows == 0). weight may be null (scale 1). workspace: at least
// layer_norm_backward_workspace_bytes(rows, cols) bytes of device memory, 4-byte aligned, when
// dweight or dbias is non-null (may be null otherwise); a smaller one is a loom::Error.
void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                         const float* dy, float* dx, float* dweight, float* dbias, int64_t rows,
                         int64_t cols, void* workspace, size_t workspace_bytes, Stream stream);
void layer_norm_backward(const BFloat16* x, const float* weight, const float* mean,
                         const float* rstd, const BFloat16* dy, BFloat16* dx, float* dweight,
                         float* dbias, int64_t rows, int64_t cols, void* workspace,
                         size_t workspace_bytes, Stream stream);

}  // namespace loom::kernels::cuda
