// Row-major C = A op(B) is the column-major C^T = op(B)^T A^T, as in gemm.cu: B and A swap
// places. Empty groups are left out of the cuBLAS call (grouped_gemm_tn writes their beta * C_g
// itself: zeros with beta 0, untouched with beta 1).
#include "kernels/cuda/grouped_gemm.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cublas_handle.h"

namespace loom::kernels::cuda {

namespace {

int to_int(const char* what, int64_t v) {
  LOOM_CHECK(v >= 0 && v <= INT_MAX, "cuda grouped_gemm: ", what, " = ", v,
             " does not fit cuBLAS's 32-bit sizes");
  return int(v);
}

// One cuBLAS grouped GEMM over the groups gathered so far (column-major terms).
struct Groups {
  std::vector<cublasOperation_t> trans_a, trans_b;
  std::vector<int> m, n, k, lda, ldb, ldc, size;
  std::vector<float> alpha, beta;
  std::vector<const void*> a, b;
  std::vector<void*> c;

  void add(cublasOperation_t ta, cublasOperation_t tb, int64_t mm, int64_t nn, int64_t kk, float al,
           const float* pa, int64_t la, const float* pb, int64_t lb, float be, float* pc,
           int64_t lc) {
    trans_a.push_back(ta);
    trans_b.push_back(tb);
    m.push_back(to_int("m", mm));
    n.push_back(to_int("n", nn));
    k.push_back(to_int("k", kk));
    lda.push_back(to_int("lda", la > 0 ? la : 1));
    ldb.push_back(to_int("ldb", lb > 0 ? lb : 1));
    ldc.push_back(to_int("ldc", lc));
    size.push_back(1);
    alpha.push_back(al);
    beta.push_back(be);
    a.push_back(pa);
    b.push_back(pb);
    c.push_back(pc);
  }

  void run(void* workspace, size_t workspace_bytes, Stream stream) {
    const size_t count = m.size();
    if (count == 0) return;
    const size_t need = 3 * count * sizeof(void*);
    LOOM_CHECK(workspace != nullptr && workspace_bytes >= need &&
                   reinterpret_cast<uintptr_t>(workspace) % alignof(void*) == 0,
               "cuda grouped_gemm: a workspace of ", workspace_bytes, " bytes at ", workspace,
               " for ", count, " groups needs ", need,
               " pointer-aligned bytes (grouped_gemm_workspace_bytes)");
    // The pointer arrays, in device memory: A's, B's, C's one after the other. The host copy is
    // pageable, so the copy is staged before cudaMemcpyAsync returns.
    std::vector<const void*> host;
    host.insert(host.end(), a.begin(), a.end());
    host.insert(host.end(), b.begin(), b.end());
    host.insert(host.end(), c.begin(), c.end());
    LOOM_CUDA_CHECK(cudaMemcpyAsync(workspace, host.data(), need, cudaMemcpyHostToDevice, stream));
    const void* const* da = static_cast<const void* const*>(workspace);
    const void* const* db = da + count;
    void* const* dc =
        const_cast<void* const*>(reinterpret_cast<const void* const*>(da + 2 * count));
    LOOM_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        cublas_handle(stream), trans_a.data(), trans_b.data(), m.data(), n.data(), k.data(),
        alpha.data(), da, CUDA_R_32F, lda.data(), db, CUDA_R_32F, ldb.data(), beta.data(), dc,
        CUDA_R_32F, ldc.data(), int(count), size.data(), CUBLAS_COMPUTE_32F));
  }
};

}  // namespace

size_t grouped_gemm_workspace_bytes(int64_t groups) {
  return size_t(groups > 0 ? groups : 0) * 3 * sizeof(void*);
}

void grouped_gemm(bool trans_b, const int64_t* rows, int64_t groups, int64_t n, int64_t k,
                  float alpha, const float* a, int64_t lda, const float* const* b, int64_t ldb,
                  float beta, float* c, int64_t ldc, void* workspace, size_t workspace_bytes,
                  Stream stream) {
  LOOM_CHECK(groups >= 0 && n >= 0 && k >= 0, "cuda grouped_gemm: bad sizes: ", groups,
             " groups, n ", n, ", k ", k);
  Groups g;
  int64_t first = 0;
  for (int64_t i = 0; i < groups; ++i) {
    LOOM_CHECK(rows[i] >= 0, "cuda grouped_gemm: group ", i, " has ", rows[i], " rows");
    // C_i^T [n, rows] = op(B_i)^T [n, k] A_i^T [k, rows].
    if (rows[i] > 0 && n > 0)
      g.add(trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n, rows[i], k, alpha, b[i], ldb,
            a + first * lda, lda, beta, c + first * ldc, ldc);
    first += rows[i];
  }
  g.run(workspace, workspace_bytes, stream);
}

void grouped_gemm_tn(const int64_t* rows, int64_t groups, int64_t m, int64_t n, float alpha,
                     const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                     float* const* c, int64_t ldc, void* workspace, size_t workspace_bytes,
                     Stream stream) {
  LOOM_CHECK(groups >= 0 && m >= 0 && n >= 0, "cuda grouped_gemm_tn: bad sizes: ", groups,
             " groups, m ", m, ", n ", n);
  Groups g;
  int64_t first = 0;
  for (int64_t i = 0; i < groups; ++i) {
    LOOM_CHECK(rows[i] >= 0, "cuda grouped_gemm_tn: group ", i, " has ", rows[i], " rows");
    if (m > 0 && n > 0) {
      if (rows[i] > 0) {
        // C_i^T [n, m] = B_i^T [n, rows] A_i [rows, m].
        g.add(CUBLAS_OP_N, CUBLAS_OP_T, n, m, rows[i], alpha, b + first * ldb, ldb, a + first * lda,
              lda, beta, c[i], ldc);
      } else if (beta == 0.0f) {  // an empty sum
        LOOM_CUDA_CHECK(cudaMemset2DAsync(c[i], size_t(ldc) * sizeof(float), 0,
                                          size_t(n) * sizeof(float), size_t(m), stream));
      } else {
        LOOM_CHECK(beta == 1.0f, "cuda grouped_gemm_tn: group ", i, " has no rows and beta is ",
                   beta, " (only 0 or 1 are supported there)");
      }
    }
    first += rows[i];
  }
  g.run(workspace, workspace_bytes, stream);
}

}  // namespace loom::kernels::cuda
