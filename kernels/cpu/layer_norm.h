// Layer normalisation over the last dim of a contiguous [rows, cols] f32 array.
// The forward saves per-row mean and rstd = 1 / sqrt(var + eps) (biased variance, as PyTorch) so
// the backward never recomputes the statistics.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// weight and bias [cols] may be null (scale 1 / shift 0). mean and rstd are [rows].
void layer_norm_forward(const float* x, const float* weight, const float* bias, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps);

// Writes (=, not +=) each non-null output: dx [rows, cols], dweight and dbias [cols].
// weight may be null (scale 1). The parameter gradients are summed in a fixed order that does
// not depend on the thread count.
void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                         const float* dy, float* dx, float* dweight, float* dbias, int64_t rows,
                         int64_t cols);

}  // namespace loom::kernels::cpu
