// Scaled dot-product attention on contiguous [BH, T, D] f32 arrays (BH = batch * heads):
// out = softmax(q k^T / sqrt(D) [+ causal mask]) v.
//
// Saved for the backward: the output and the per-row log-sum-exp lse [BH, T] of the scaled,
// masked scores -- not the [BH, T, T] probabilities. The backward recomputes the probabilities
// as exp(q k^T / sqrt(D) - lse), one extra GEMM per block, so saved memory stays O(T) per row
// at any sequence length.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                       int64_t bh, int64_t t, int64_t d, bool causal);

// Writes (=) dq, dk and dv, each [BH, T, D].
void attention_backward(const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv,
                        int64_t bh, int64_t t, int64_t d, bool causal);

}  // namespace loom::kernels::cpu
