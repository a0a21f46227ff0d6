// cuBLAS is column-major; a row-major matrix read column-major is its transpose. So the row-major
// C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: B and A swap places and
// m and n swap, while the transpose flags and leading dims pass through unchanged.
//
// One cublasHandle_t per device, created on first use and kept for the life of the process
// (destroying it at exit would race the CUDA runtime's own teardown). The handle is bound to the
// caller's stream before every call. Handles are not meant to be used by two host threads at
// once; loom issues GEMMs from one thread per device.
//
// The math mode stays CUBLAS_DEFAULT_MATH: f32 GEMMs run in full f32, not TF32, so CUDA results
// match the CPU's to f32 rounding, as the equivalence tests need.
#include <cublas_v2.h>

#include <climits>
#include <mutex>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm.h"

namespace loom::kernels::cuda {

namespace {

cublasHandle_t handle_for_current_device(Stream stream) {
  static std::mutex mutex;
  static std::vector<cublasHandle_t> handles;
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  cublasHandle_t handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (size_t(device) >= handles.size()) handles.resize(size_t(device) + 1, nullptr);
    if (handles[size_t(device)] == nullptr)
      LOOM_CUBLAS_CHECK(cublasCreate(&handles[size_t(device)]));
    handle = handles[size_t(device)];
  }
  LOOM_CUBLAS_CHECK(cublasSetStream(handle, stream));
  return handle;
}

int to_int(const char* what, int64_t v) {
  LOOM_CHECK(v >= 0 && v <= INT_MAX, "cuda gemm: ", what, " = ", v,
             " does not fit cuBLAS's 32-bit sizes");
  return int(v);
}

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// cuBLAS rejects a leading dim below 1 even when the matrix is empty (k == 0 reads nothing).
int64_t at_least_one(int64_t ld) { return ld > 0 ? ld : 1; }

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          Stream stream) {
  if (m == 0 || n == 0) return;
  cublasHandle_t handle = handle_for_current_device(stream);
  LOOM_CUBLAS_CHECK(cublasSgemm(handle, op(trans_b), op(trans_a), to_int("n", n), to_int("m", m),
                                to_int("k", k), &alpha, b, to_int("ldb", at_least_one(ldb)), a,
                                to_int("lda", at_least_one(lda)), &beta, c, to_int("ldc", ldc)));
}

void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, int64_t stride_a, const float* b,
                          int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Stream stream) {
  if (m == 0 || n == 0 || batch == 0) return;
  LOOM_CHECK(batch == 1 || stride_c != 0, "cuda gemm_strided_batched: stride_c is 0 for ", batch,
             " products");
  cublasHandle_t handle = handle_for_current_device(stream);
  LOOM_CUBLAS_CHECK(cublasSgemmStridedBatched(
      handle, op(trans_b), op(trans_a), to_int("n", n), to_int("m", m), to_int("k", k), &alpha, b,
      to_int("ldb", at_least_one(ldb)), (long long)stride_b, a, to_int("lda", at_least_one(lda)),
      (long long)stride_a, &beta, c, to_int("ldc", ldc), (long long)stride_c,
      to_int("batch", batch)));
}

}  // namespace loom::kernels::cuda
