// Scaled dot-product attention on CUDA: the twin of kernels/cpu/attention.h. Contiguous
// [BH, T, D] arrays (BH = batch * heads), out = softmax(q k^T / sqrt(D) [+ causal mask]) v, and
// lse [BH, T] the log-sum-exp of each row of the scaled, masked scores, saved for the backward.
// Every pointer is device memory.
//
// FlashAttention-2's algorithm: neither pass materialises the [T, T] scores, so memory stays O(T)
// per row at any sequence length. Arithmetic and accumulation are f32; the BFloat16 overloads
// only store q, k, v, out, dout, dq, dk, dv as bf16 (lse stays f32) and round once on store.
//
// Results equal the CPU kernel's to f32 rounding (the order of additions differs) and are
// bit-identical from run to run on one GPU: no atomics, every sum in a fixed order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda {

// The largest head dim d the kernels take; a larger d is a loom::Error naming both. (Any d in
// [0, attention_max_head_dim()] works; d = 0 gives lse = log(visible keys), as on the CPU.)
int64_t attention_max_head_dim();

// Writes (=) out [BH, T, D] and lse [BH, T].
void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                       int64_t bh, int64_t t, int64_t d, bool causal, Stream stream);
void attention_forward(const BFloat16* q, const BFloat16* k, const BFloat16* v, BFloat16* out,
                       float* lse, int64_t bh, int64_t t, int64_t d, bool causal, Stream stream);

// Device scratch the backward needs (the per-row rowsum(dout * out), BH * T floats).
size_t attention_backward_workspace_bytes(int64_t bh, int64_t t, int64_t d);

// Writes (=) dq, dk and dv, each [BH, T, D], from the forward's out and lse. workspace: at least
// attention_backward_workspace_bytes(bh, t, d) bytes of device memory, 4-byte aligned (a
// loom::Error otherwise); its contents on entry do not matter.
void attention_backward(const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv,
                        int64_t bh, int64_t t, int64_t d, bool causal, void* workspace,
                        size_t workspace_bytes, Stream stream);
void attention_backward(const BFloat16* q, const BFloat16* k, const BFloat16* v,
                        const BFloat16* out, const float* lse, const BFloat16* dout, BFloat16* dq,
                        BFloat16* dk, BFloat16* dv, int64_t bh, int64_t t, int64_t d, bool causal,
                        void* workspace, size_t workspace_bytes, Stream stream);

}  // namespace loom::kernels::cuda
