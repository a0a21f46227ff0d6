// Row-major f32 GEMM on host memory: C = alpha * op(A) * op(B) + beta * C, where op(A) is [m, k]
// (A stored [m, k], or [k, m] when trans_a) and op(B) is [k, n] (B stored [k, n], or [n, k] when
// trans_b). Leading dims are the distance between rows in elements, as in BLAS but row-major.
// With beta == 0, C is only written (it may hold garbage, e.g. fresh memory).
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// `batch` independent products; operand i starts stride_x elements after operand i - 1. A stride
// of 0 for a or b shares that operand across the batch. stride_c must be nonzero (products that
// sum into one C are a loop of gemm with beta = 1, which keeps the summation order fixed).
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, int64_t stride_a, const float* b,
                          int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                          int64_t stride_c, int64_t batch);

}  // namespace loom::kernels::cpu
