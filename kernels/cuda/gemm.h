// Row-major GEMM on device memory through cuBLAS and cuBLASLt: the CUDA twins of
// kernels/cpu/gemm.h (same arguments and meaning: op(A) is [m, k], op(B) is [k, n], C is [m, n],
// leading dims are row strides in elements), plus bf16 overloads and GEMMs with a fused bias and
// GELU. Sizes and leading dims must fit in int (cuBLAS's 32-bit API). f32 GEMMs run in full f32
// (never TF32), so CUDA matches the CPU to f32 rounding.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"  // BFloat16

namespace loom::kernels::cuda {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          Stream stream);

void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, int64_t stride_a, const float* b,
                          int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Stream stream);

// bf16 A, B and C; products accumulated in f32 (cublasGemmEx with CUBLAS_COMPUTE_32F, split-K
// partial sums kept in f32 too), alpha * acc + beta * C formed in f32 and rounded to bf16 once.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, BFloat16* c,
          int64_t ldc, Stream stream);

void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const BFloat16* a, int64_t lda, int64_t stride_a, const BFloat16* b,
                          int64_t ldb, int64_t stride_b, float beta, BFloat16* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Stream stream);

// bf16 A and B, f32 C: the products of bf16 values accumulated and stored in f32, never rounded
// to bf16 (GEMM attention's scores: kernels/cuda/attention_gemm.cu).
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const BFloat16* a, int64_t lda, int64_t stride_a, const BFloat16* b,
                          int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Stream stream);

// C = op(A) op(B) + bias, where bias [n] (f32, device memory, never null) is added to every row;
// then, when gelu, C = gelu(C) with GPT-2's tanh form (kernels/cpu/gelu.h). When gelu and
// pre_gelu is not null, pre_gelu receives op(A) op(B) + bias (the input the backward needs),
// laid out like C (leading dim ldc). C is only written. Accumulation and the epilogue run in f32;
// the bf16 overload rounds C and pre_gelu to bf16 once.
//
// Runs as one cuBLASLt matmul with the BIAS / GELU_BIAS / GELU_AUX_BIAS epilogue where cuBLASLt
// offers an algorithm for the case (for GELU_AUX_BIAS it needs ldc % 8 == 0). Otherwise, and for
// k == 0, it falls back to a GEMM followed by an elementwise bias-GELU kernel (loom's GELU):
// the same rounding steps in f32; in bf16 op(A) op(B) is then rounded to bf16 before the bias is
// added (one rounding more). See Note [Fused bias-GELU GEMM] in gemm.cu.
void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
               int64_t lda, const float* b, int64_t ldb, const float* bias, bool gelu,
               float* pre_gelu, float* c, int64_t ldc, Stream stream);

void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BFloat16* a,
               int64_t lda, const BFloat16* b, int64_t ldb, const float* bias, bool gelu,
               BFloat16* pre_gelu, BFloat16* c, int64_t ldc, Stream stream);

// How many gemm_bias calls so far took the unfused fallback (a count for tests and benchmarks,
// which report whether cuBLASLt fused the epilogue on this GPU).
int64_t gemm_bias_fallback_count();

}  // namespace loom::kernels::cuda
