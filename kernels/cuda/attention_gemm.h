// Scaled dot-product attention on CUDA through cuBLAS GEMMs: the same function, arguments and
// results as kernels/cuda/attention.h (layout [BH, T, D], out = softmax(q k^T / sqrt(D) [+ causal
// mask]) v, lse [BH, T]), computed another way. The scores of a group of heads are materialised
// in a workspace as f32 [heads, T, T], so the two T^2 D products of the forward and the five of
// the backward run as batched cuBLAS GEMMs (compute 32F, never TF32) instead of CUDA-core loops,
// and a warp-per-row kernel does the softmax (forward) and P, dS (backward) in between. See
// Note [GEMM attention] in attention_gemm.cu.
//
// The price is workspace: T^2 floats per head in the forward, 2 T^2 in the backward, plus f32
// copies of some of the head's [T, D] arrays for bf16. Heads go through in passes of as many as the
// workspace holds; attention_gemm_heads_per_pass says how many, and 0 means the caller should use
// the flash kernels of attention.h (O(T) memory) instead.
//
// Results equal the CPU kernel's (kernels/cpu/attention.h) to f32 rounding, as attention.h's do;
// every buffer is written by exactly one GEMM or kernel thread, so runs are bit-identical on one
// GPU. The BFloat16 overloads compute in f32 and round the results to bf16 once, as attention.h's
// bf16 overloads do: products of two bf16 arrays read them directly (exact products, f32 sums),
// products with the f32 probabilities use f32 copies. Any head dim works (no maximum).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda {

// Bytes of workspace one pass over `heads` heads needs (forward or backward, f32 or bf16 storage).
size_t attention_gemm_workspace_bytes(int64_t heads, int64_t t, int64_t d, bool bf16,
                                      bool backward);

// The most heads (at most bh) one pass can take within max_bytes of workspace; 0 when not even
// one head fits (or bh, t or d is 0: nothing to gain over the flash kernels).
int64_t attention_gemm_heads_per_pass(int64_t bh, int64_t t, int64_t d, bool bf16, bool backward,
                                      size_t max_bytes);

// Writes (=) out [BH, T, D] and lse [BH, T]. workspace: device memory, 4-byte aligned, of at
// least attention_gemm_workspace_bytes(1, t, d, ...) bytes (a loom::Error naming both otherwise);
// the heads per pass follow from its size.
void attention_gemm_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                            int64_t bh, int64_t t, int64_t d, bool causal, void* workspace,
                            size_t workspace_bytes, Stream stream);
void attention_gemm_forward(const BFloat16* q, const BFloat16* k, const BFloat16* v, BFloat16* out,
                            float* lse, int64_t bh, int64_t t, int64_t d, bool causal,
                            void* workspace, size_t workspace_bytes, Stream stream);

// Writes (=) dq, dk and dv, each [BH, T, D], from the forward's out and lse; workspace as above
// (with backward = true).
void attention_gemm_backward(const float* q, const float* k, const float* v, const float* out,
                             const float* lse, const float* dout, float* dq, float* dk, float* dv,
                             int64_t bh, int64_t t, int64_t d, bool causal, void* workspace,
                             size_t workspace_bytes, Stream stream);
void attention_gemm_backward(const BFloat16* q, const BFloat16* k, const BFloat16* v,
                             const BFloat16* out, const float* lse, const BFloat16* dout,
                             BFloat16* dq, BFloat16* dk, BFloat16* dv, int64_t bh, int64_t t,
                             int64_t d, bool causal, void* workspace, size_t workspace_bytes,
                             Stream stream);

}  // namespace loom::kernels::cuda
