// loom's own f32 GEMM for AVX2 + FMA targets without AVX-512 (See Note [An AVX2 GEMM] in
// gemm_avx2.cpp). kernels/cpu/gemm.cpp calls it where it is the faster path; it is exposed here so
// that its test runs it on every machine that can execute it, AVX-512 ones included.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu::detail {

// Whether this build holds the AVX2 kernel (compiled with AVX2 and FMA).
bool gemm_avx2_compiled();

// Whether gemm() uses it: compiled, and the target lacks AVX-512, where Eigen's 16-lane kernel
// measured on par with OpenBLAS.
bool gemm_avx2_preferred();

// gemm()'s contract (kernels/cpu/gemm.h) with m, n, k > 0. Threads over blocks of C unless it
// is called inside an OpenMP parallel region; each element of C is summed over k in the same
// order whatever the thread count, shape of C or alignment, so its bits depend on its row of
// op(A), its column of op(B), alpha and beta alone. Must only be called when compiled.
void gemm_avx2(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

}  // namespace loom::kernels::cpu::detail
