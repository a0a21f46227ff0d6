// Row-major f32 GEMM on device memory through cuBLAS: the CUDA twins of kernels/cpu/gemm.h, with
// the same arguments and meaning. Sizes and leading dims must fit in int (cuBLAS's 32-bit API).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          Stream stream);

void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, int64_t stride_a, const float* b,
                          int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Stream stream);

}  // namespace loom::kernels::cuda
