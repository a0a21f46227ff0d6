// Grouped GEMMs on host memory: many row-major products of different sizes in one call, the
// shapes a mixture of experts needs when its tokens are sorted by expert (rows of expert g
// consecutive, each expert its own weight). The CPU twins of kernels/cuda/grouped_gemm.h: each
// group is exactly the cpu::gemm call a per-expert linear makes, so results are bit for bit the
// ungrouped ones.
//
//   grouped_gemm     C_g = alpha * A_g op(B_g) + beta * C_g, A_g [rows_g, k] and C_g [rows_g, n]
//                    the g-th blocks of rows of the stacked A and C, op(B_g) [k, n] from b[g]
//                    (B_g stored [n, k] when trans_b): a linear's forward (trans_b, B_g its
//                    weight) and its input gradient (B_g the weight, not transposed)
//   grouped_gemm_tn  C_g = alpha * A_g^T B_g + beta * C_g, A_g [rows_g, m] and B_g [rows_g, n]
//                    the g-th blocks of rows of the stacked A and B, C_g [m, n] at c[g]: a
//                    linear's weight gradient (A the output gradient, B the input)
// A group without rows has an empty C_g in grouped_gemm; in grouped_gemm_tn its C_g becomes
// beta * C_g (zeros when beta == 0: C may hold garbage then). Leading dims are row strides.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

void grouped_gemm(bool trans_b, const int64_t* rows, int64_t groups, int64_t n, int64_t k,
                  float alpha, const float* a, int64_t lda, const float* const* b, int64_t ldb,
                  float beta, float* c, int64_t ldc);

void grouped_gemm_tn(const int64_t* rows, int64_t groups, int64_t m, int64_t n, float alpha,
                     const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                     float* const* c, int64_t ldc);

}  // namespace loom::kernels::cpu
