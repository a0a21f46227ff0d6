// Grouped GEMMs on device memory: the CUDA twins of kernels/cpu/grouped_gemm.h (same arguments
// and meaning; `b` / `c` are host arrays of device pointers), each one cuBLAS grouped GEMM
// (cublasGemmGroupedBatchedEx: every group its own sizes and pointers, one launch for all) in
// full f32 (CUBLAS_COMPUTE_32F, never TF32), so CUDA matches the CPU twin to f32 rounding.
// cuBLAS reads the pointer arrays from device memory: the caller gives a workspace of
// grouped_gemm_workspace_bytes(groups) bytes (pointer-aligned) on the stream's device, which the
// call fills before the GEMM (the workspace must stay alive until the stream has run it).
// Sizes and leading dims must fit in int.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

size_t grouped_gemm_workspace_bytes(int64_t groups);

void grouped_gemm(bool trans_b, const int64_t* rows, int64_t groups, int64_t n, int64_t k,
                  float alpha, const float* a, int64_t lda, const float* const* b, int64_t ldb,
                  float beta, float* c, int64_t ldc, void* workspace, size_t workspace_bytes,
                  Stream stream);

void grouped_gemm_tn(const int64_t* rows, int64_t groups, int64_t m, int64_t n, float alpha,
                     const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                     float* const* c, int64_t ldc, void* workspace, size_t workspace_bytes,
                     Stream stream);

}  // namespace loom::kernels::cuda
