// On AVX2 and AVX-512 targets loom's own kernel does the work (Note [A packed GEMM] in
// gemm_packed.cpp); elsewhere Eigen does: the raw row-major pointers are wrapped in Eigen::Map with
// an outer stride, and a transposed operand is the Map's .transpose() expression, never a
// materialised copy, so Eigen's blocked GEMM packs straight from the caller's memory. .noalias()
// stops Eigen from evaluating the product into a temporary before assigning it to C.
#include "kernels/cpu/gemm.h"

// See Note [Eigen under GCC 12] in kernels/cpu/eigen.h. Here the false positive surfaces where
// Eigen's GEMM templates are instantiated, in this file, so it is silenced for the whole file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/eigen.h"

#include "core/error.h"
#include "kernels/cpu/gemm_packed.h"

namespace loom::kernels::cpu {

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using MutableMap = Eigen::Map<RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;

template <typename LhsExpr, typename RhsExpr>
void product_into(const LhsExpr& lhs, const RhsExpr& rhs, float alpha, float beta, MutableMap& c) {
  if (beta == 0.0f) {
    c.noalias() = alpha * lhs * rhs;
  } else {
    if (beta != 1.0f) c *= beta;
    c.noalias() += alpha * lhs * rhs;
  }
}

void gemm_one(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) {
  if (m == 0 || n == 0) return;
  MutableMap cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {  // an empty sum: C = beta * C, and C is not read when beta == 0
    if (beta == 0.0f)
      cm.setZero();
    else
      cm *= beta;
    return;
  }
  if (detail::gemm_packed_preferred()) {
    detail::gemm_packed(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // The stored shapes: A is [m, k] or [k, m]; B is [k, n] or [n, k].
  ConstMap am(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  ConstMap bm(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  if (!trans_a && !trans_b) product_into(am, bm, alpha, beta, cm);
  if (!trans_a && trans_b) product_into(am, bm.transpose(), alpha, beta, cm);
  if (trans_a && !trans_b) product_into(am.transpose(), bm, alpha, beta, cm);
  if (trans_a && trans_b) product_into(am.transpose(), bm.transpose(), alpha, beta, cm);
}

void check_leading_dims(const char* what, bool trans_a, bool trans_b, int64_t m, int64_t n,
                        int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  LOOM_ASSERT(m >= 0 && n >= 0 && k >= 0, what, ": negative size m=", m, " n=", n, " k=", k);
  LOOM_ASSERT(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n, what,
              ": leading dims lda=", lda, " ldb=", ldb, " ldc=", ldc, " too small for m=", m,
              " n=", n, " k=", k);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_leading_dims("cpu gemm", trans_a, trans_b, m, n, k, lda, ldb, ldc);
  gemm_one(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, int64_t stride_a, const float* b,
                          int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                          int64_t stride_c, int64_t batch) {
  check_leading_dims("cpu gemm_strided_batched", trans_a, trans_b, m, n, k, lda, ldb, ldc);
  LOOM_ASSERT(batch <= 1 || stride_c != 0, "cpu gemm_strided_batched: stride_c is 0 for ", batch,
              " products");
  // Many small products (attention's per-head GEMMs) are spread over threads one product each;
  // a large product is left to the GEMM, which threads inside one product. Inside this parallel
  // region Eigen sees omp_get_num_threads() > 1 and the AVX2 kernel omp_in_parallel(), and both
  // stay single-threaded, so nothing oversubscribes.
  const bool small = m * n * k <= (int64_t(1) << 21);
#pragma omp parallel for schedule(static) if (batch > 1 && small)
  for (int64_t i = 0; i < batch; ++i) {
    gemm_one(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
             c + i * stride_c, ldc);
  }
}

}  // namespace loom::kernels::cpu
