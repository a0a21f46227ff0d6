// cuBLAS is column-major; a row-major matrix read column-major is its transpose. So the row-major
// C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: B and A swap places and
// m and n swap, while the transpose flags and leading dims pass through unchanged. The same swap
// serves cuBLASLt, where the row-major bias over C's columns becomes the bias over the rows of
// the column-major D (length n, as CUBLASLT_EPILOGUE_BIAS wants).
//
// One cublasHandle_t per device, created on first use and kept for the life of the process
// (destroying it at exit would race the CUDA runtime's own teardown). The handle is bound to the
// caller's stream before every call. Handles are not meant to be used by two host threads at
// once; loom issues GEMMs from one thread per device.
//
// The math mode stays CUBLAS_DEFAULT_MATH: f32 GEMMs run in full f32, not TF32, so CUDA results
// match the CPU's to f32 rounding, as the equivalence tests need. It adds
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, which only affects bf16 outputs: split-K
// partial sums stay in f32 instead of being rounded to bf16 between the splits.
//
// Note [Fused bias-GELU GEMM]
// gemm_bias runs as one cublasLtMatmul with the BIAS, GELU_BIAS or GELU_AUX_BIAS epilogue, so the
// product never makes a round trip through memory before its bias and GELU. Points to know:
// - cuBLASLt's GELU is the tanh approximation (cuBLAS documents it only as "GELU"; PyTorch's
//   _addmm_activation relies on it being the tanh form, pytorch/pytorch#104061), the same function
//   as loom's kernels/cpu/gelu.h, but computed by NVIDIA's own code: CUDA and CPU agree to the
//   accuracy of its tanh, not bit for bit. cuda_gemm_test.cpp states the tolerance.
// - The bias is f32 for both overloads (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = CUDA_R_32F, which
//   for a bf16 D differs from cuBLASLt's default, a bias of D's type). The pre-GELU aux output has
//   D's type and layout; cuBLASLt wants its leading dim to be a multiple of 8.
// - When cuBLASLt's heuristic offers no algorithm (an unsupported type combination, alignment,
//   an aux leading dim that is not a multiple of 8) or k == 0, a plain GEMM writes op(A) op(B)
//   into C and bias_gelu_kernel finishes it with loom's GELU formula. In f32 that is the CPU's
//   own order (GEMM, then bias, then GELU); in bf16 the product is rounded to bf16 before the
//   bias is added, one rounding more than the fused path.
// - cuBLASLt needs workspace memory. A 32 MiB workspace per (device, stream) that runs a fused
//   GEMM is cudaMalloc'ed at its first use and kept for the life of the process, like the
//   handles: one workspace must not serve two streams that may run at the same time. This is the
//   only allocation here; it happens once per stream, never in steady state.
// - bf16 split-K reductions are restricted to f32 (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE), as
//   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION does for cublasGemmEx.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cpu/gelu.h"  // gelu_minus_2u: loom's GELU formula
#include "kernels/cuda/check.h"
#include "kernels/cuda/cublas_handle.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

std::atomic<int64_t> gemm_bias_fallbacks{0};

}  // namespace

cublasHandle_t cublas_handle(Stream stream) {
  static std::mutex mutex;
  static std::vector<cublasHandle_t> handles;
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  cublasHandle_t handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (size_t(device) >= handles.size()) handles.resize(size_t(device) + 1, nullptr);
    if (handles[size_t(device)] == nullptr) {
      LOOM_CUBLAS_CHECK(cublasCreate(&handles[size_t(device)]));
      LOOM_CUBLAS_CHECK(cublasSetMathMode(
          handles[size_t(device)],
          cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    }
    handle = handles[size_t(device)];
  }
  LOOM_CUBLAS_CHECK(cublasSetStream(handle, stream));
  return handle;
}

namespace {

cublasHandle_t handle_for_current_device(Stream stream) { return cublas_handle(stream); }

// The cuBLASLt handle of the current device and the workspace of (device, stream); see
// Note [Fused bias-GELU GEMM] for why the workspace is per stream and kept forever.
struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  std::map<Stream, void*> workspaces;
};

std::pair<cublasLtHandle_t, void*> lt_for_current_device(Stream stream) {
  static std::mutex mutex;
  static std::vector<LtDevice> devices;
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (size_t(device) >= devices.size()) devices.resize(size_t(device) + 1);
  LtDevice& d = devices[size_t(device)];
  if (d.handle == nullptr) LOOM_CUBLAS_CHECK(cublasLtCreate(&d.handle));
  void*& workspace = d.workspaces[stream];
  if (workspace == nullptr) LOOM_CUDA_CHECK(cudaMalloc(&workspace, kLtWorkspaceBytes));
  return {d.handle, workspace};
}

int to_int(const char* what, int64_t v) {
  LOOM_CHECK(v >= 0 && v <= INT_MAX, "cuda gemm: ", what, " = ", v,
             " does not fit cuBLAS's 32-bit sizes");
  return int(v);
}

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// cuBLAS rejects a leading dim below 1 even when the matrix is empty (k == 0 reads nothing).
int64_t at_least_one(int64_t ld) { return ld > 0 ? ld : 1; }

// ---------------------------------------------------------------- element types

template <typename T>
struct ElementType;
template <>
struct ElementType<float> {
  static constexpr cudaDataType_t kCuda = CUDA_R_32F;
};
template <>
struct ElementType<BFloat16> {
  static constexpr cudaDataType_t kCuda = CUDA_R_16BF;
};

__device__ inline float load_f32(const float* p) { return *p; }
__device__ inline float load_f32(const BFloat16* p) { return bf16_to_float(*p); }
__device__ inline void store_f32(float* p, float v) { *p = v; }
__device__ inline void store_f32(BFloat16* p, float v) { *p = float_to_bf16(v); }  // RNE

// ---------------------------------------------------------------- fallback epilogue

// c[i, j] = gelu?(c[i, j] + bias[j]), pre_gelu[i, j] = c[i, j] + bias[j]; row-major, leading
// dim ldc for both. GELU as kernels/cuda/gelu.cu computes it. A flat grid-stride loop over m n:
// a 2-D grid (rows over y, columns over x, no division per element) measured slower on an H100
// (0.21 against 0.17 ms for gemm_bias at 8192 x 3072 bf16, 2026-11-26).
template <typename T>
__global__ void bias_gelu_kernel(T* c, int64_t ldc, T* pre_gelu, const float* bias, int64_t m,
                                 int64_t n, bool gelu) {
  const int64_t total = m * n;
  LOOM_GRID_STRIDE(e, total) {
    const int64_t i = e / n, j = e % n;
    const int64_t at = i * ldc + j;
    const float z = load_f32(c + at) + bias[j];
    if (!gelu) {
      store_f32(c + at, z);
      continue;
    }
    if (pre_gelu != nullptr) store_f32(pre_gelu + at, z);
    store_f32(c + at, z * (1.0f / (1.0f + expf(gelu_minus_2u(z)))));
  }
}

// ---------------------------------------------------------------- cuBLASLt

// Owners of cuBLASLt descriptors, so an error part-way leaks nothing.
struct LtMatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~LtMatmulDesc() {
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
  template <typename V>
  void set(cublasLtMatmulDescAttributes_t attr, const V& value) {
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
  }
};
struct LtLayout {
  cublasLtMatrixLayout_t layout = nullptr;
  ~LtLayout() {
    if (layout) cublasLtMatrixLayoutDestroy(layout);
  }
};
struct LtPreference {
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtPreference() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
  }
  template <typename V>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
    LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  }
};

// The largest power of two up to 256 dividing the address: what the heuristic may assume.
uint32_t alignment_of(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// One cublasLtMatmul with a bias (and GELU) epilogue; returns false, having enqueued nothing,
// when cuBLASLt offers no algorithm for the case. Sizes are already checked (k > 0).
template <typename T>
bool try_lt_gemm_bias(bool trans_a, bool trans_b, int m, int n, int k, const T* a, int lda,
                      const T* b, int ldb, const float* bias, bool gelu, T* pre_gelu, T* c, int ldc,
                      Stream stream) {
  const bool aux = gelu && pre_gelu != nullptr;
  if (aux && ldc % 8 != 0) return false;  // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD's rule
  // Epilogue vectors are read with vector loads; some cuBLASLt versions fail at run time on a
  // bias that is not 16-byte aligned instead of choosing another algorithm.
  if (alignment_of(bias) < 16 || (aux && alignment_of(pre_gelu) < 16)) return false;
  const auto [handle, workspace] = lt_for_current_device(stream);
  const cudaDataType_t type = ElementType<T>::kCuda;

  LtMatmulDesc desc;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op(trans_b));  // column-major: B first (see the top)
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op(trans_a));
  const cublasLtEpilogue_t epilogue = !gelu ? CUBLASLT_EPILOGUE_BIAS
                                      : aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                            : CUBLASLT_EPILOGUE_GELU_BIAS;
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_32F));
  if (aux) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(pre_gelu));
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(ldc));
  }

  // Stored matrices, column-major: B^T-side operand is n x k (k x n when trans_b), A's is
  // k x m (m x k when trans_a), D is n x m.
  LtLayout layout_b, layout_a, layout_c;
  LOOM_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout_b.layout, type, trans_b ? k : n, trans_b ? n : k, ldb));
  LOOM_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout_a.layout, type, trans_a ? m : k, trans_a ? k : m, lda));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_c.layout, type, n, m, ldc));

  LtPreference pref;
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.pref));
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kLtWorkspaceBytes));
  if (type != CUDA_R_32F)
    pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_NONE));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(b));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(a));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(c));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(c));

  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, desc.desc, layout_b.layout, layout_a.layout, layout_c.layout, layout_c.layout,
      pref.pref, 1, &result, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return false;

  const float one = 1.0f, zero = 0.0f;  // C is only written (beta = 0); D is C
  const cublasStatus_t run = cublasLtMatmul(
      handle, desc.desc, &one, b, layout_b.layout, a, layout_a.layout, &zero, c, layout_c.layout, c,
      layout_c.layout, &result.algo, workspace, kLtWorkspaceBytes, stream);
  // Refused before launching anything: the fallback computes the same thing.
  if (run == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  LOOM_CUBLAS_CHECK(run);
  return true;
}

template <typename T>
void gemm_bias_impl(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a,
                    int64_t lda, const T* b, int64_t ldb, const float* bias, bool gelu, T* pre_gelu,
                    T* c, int64_t ldc, Stream stream) {
  const int mi = to_int("m", m), ni = to_int("n", n), ki = to_int("k", k);
  if (m == 0 || n == 0) return;
  LOOM_CHECK(bias != nullptr, "cuda gemm_bias: bias is null (it must hold n = ", n, " floats)");
  LOOM_CHECK(ldc >= n, "cuda gemm_bias: ldc = ", ldc, " is less than n = ", n);
  const int ldci = to_int("ldc", ldc);
  if (k > 0 && try_lt_gemm_bias(trans_a, trans_b, mi, ni, ki, a, to_int("lda", lda), b,
                                to_int("ldb", ldb), bias, gelu, pre_gelu, c, ldci, stream))
    return;
  // See Note [Fused bias-GELU GEMM]: a GEMM, then the epilogue as its own kernel.
  gemm_bias_fallbacks.fetch_add(1, std::memory_order_relaxed);
  if (k == 0)
    LOOM_CUDA_CHECK(
        cudaMemset2DAsync(c, size_t(ldc) * sizeof(T), 0, size_t(n) * sizeof(T), size_t(m), stream));
  else
    gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, stream);
  LOOM_LAUNCH(bias_gelu_kernel<T>, grid_stride_blocks(m * n), kBlockThreads, 0, stream, c, ldc,
              gelu ? pre_gelu : nullptr, bias, m, n, gelu);
}

// bf16 A and B, C of type C (bf16 or f32), accumulated in f32: one cublasGemmStridedBatchedEx.
template <typename C>
void bf16_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const BFloat16* a, int64_t lda, int64_t stride_a, const BFloat16* b,
                          int64_t ldb, int64_t stride_b, float beta, C* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Stream stream) {
  if (m == 0 || n == 0 || batch == 0) return;
  LOOM_CHECK(batch == 1 || stride_c != 0, "cuda gemm_strided_batched: stride_c is 0 for ", batch,
             " products");
  cublasHandle_t handle = handle_for_current_device(stream);
  LOOM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, op(trans_b), op(trans_a), to_int("n", n), to_int("m", m), to_int("k", k), &alpha, b,
      CUDA_R_16BF, to_int("ldb", at_least_one(ldb)), (long long)stride_b, a, CUDA_R_16BF,
      to_int("lda", at_least_one(lda)), (long long)stride_a, &beta, c, ElementType<C>::kCuda,
      to_int("ldc", ldc), (long long)stride_c, to_int("batch", batch), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace

int64_t gemm_bias_fallback_count() { return gemm_bias_fallbacks.load(std::memory_order_relaxed); }

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

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, BFloat16* c,
          int64_t ldc, Stream stream) {
  if (m == 0 || n == 0) return;
  cublasHandle_t handle = handle_for_current_device(stream);
  LOOM_CUBLAS_CHECK(cublasGemmEx(handle, op(trans_b), op(trans_a), to_int("n", n), to_int("m", m),
                                 to_int("k", k), &alpha, b, CUDA_R_16BF,
                                 to_int("ldb", at_least_one(ldb)), a, CUDA_R_16BF,
                                 to_int("lda", at_least_one(lda)), &beta, c, CUDA_R_16BF,
                                 to_int("ldc", ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const BFloat16* a, int64_t lda, int64_t stride_a, const BFloat16* b,
                          int64_t ldb, int64_t stride_b, float beta, BFloat16* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Stream stream) {
  bf16_strided_batched(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta,
                       c, ldc, stride_c, batch, stream);
}

void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const BFloat16* a, int64_t lda, int64_t stride_a, const BFloat16* b,
                          int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Stream stream) {
  bf16_strided_batched(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta,
                       c, ldc, stride_c, batch, stream);
}

void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
               int64_t lda, const float* b, int64_t ldb, const float* bias, bool gelu,
               float* pre_gelu, float* c, int64_t ldc, Stream stream) {
  gemm_bias_impl(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, gelu, pre_gelu, c, ldc, stream);
}

void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BFloat16* a,
               int64_t lda, const BFloat16* b, int64_t ldb, const float* bias, bool gelu,
               BFloat16* pre_gelu, BFloat16* c, int64_t ldc, Stream stream) {
  gemm_bias_impl(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, gelu, pre_gelu, c, ldc, stream);
}

}  // namespace loom::kernels::cuda
