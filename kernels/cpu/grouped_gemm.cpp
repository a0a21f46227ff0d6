#include "kernels/cpu/grouped_gemm.h"

#include "core/error.h"
#include "kernels/cpu/gemm.h"

namespace loom::kernels::cpu {

void grouped_gemm(bool trans_b, const int64_t* rows, int64_t groups, int64_t n, int64_t k,
                  float alpha, const float* a, int64_t lda, const float* const* b, int64_t ldb,
                  float beta, float* c, int64_t ldc) {
  LOOM_CHECK(groups >= 0 && n >= 0 && k >= 0, "cpu grouped_gemm: bad sizes: ", groups,
             " groups, n ", n, ", k ", k);
  int64_t first = 0;  // the group's first row in A and C
  for (int64_t g = 0; g < groups; ++g) {
    LOOM_CHECK(rows[g] >= 0, "cpu grouped_gemm: group ", g, " has ", rows[g], " rows");
    if (rows[g] > 0 && n > 0)
      gemm(false, trans_b, rows[g], n, k, alpha, a + first * lda, lda, b[g], ldb, beta,
           c + first * ldc, ldc);
    first += rows[g];
  }
}

void grouped_gemm_tn(const int64_t* rows, int64_t groups, int64_t m, int64_t n, float alpha,
                     const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                     float* const* c, int64_t ldc) {
  LOOM_CHECK(groups >= 0 && m >= 0 && n >= 0, "cpu grouped_gemm_tn: bad sizes: ", groups,
             " groups, m ", m, ", n ", n);
  int64_t first = 0;
  for (int64_t g = 0; g < groups; ++g) {
    LOOM_CHECK(rows[g] >= 0, "cpu grouped_gemm_tn: group ", g, " has ", rows[g], " rows");
    if (m > 0 && n > 0) {
      if (rows[g] > 0) {
        gemm(true, false, m, n, rows[g], alpha, a + first * lda, lda, b + first * ldb, ldb, beta,
             c[g], ldc);
      } else {  // an empty sum: beta * C_g
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j)
            c[g][i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[g][i * ldc + j];
      }
    }
    first += rows[g];
  }
}

}  // namespace loom::kernels::cpu
