// loom's own f32 GEMM for AVX2 + FMA and AVX-512 targets (See Note [A packed GEMM] in
// gemm_packed.cpp). kernels/cpu/gemm.cpp calls it where it is the faster path; it is exposed here
// so that its test runs it whatever gemm() prefers.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu::detail {

// Whether this build holds the kernel (compiled with AVX2 and FMA; zmm-wide with AVX-512).
bool gemm_packed_compiled();

// Whether gemm() uses it: wherever it is compiled (Eigen's kernels measured slower, AVX-512 on
// Zen 4 included).
bool gemm_packed_preferred();

// gemm()'s contract (kernels/cpu/gemm.h) with m, n, k > 0. Threads over blocks of C unless it
// is called inside an OpenMP parallel region; each element of C is summed over k in the same
// order whatever the thread count, shape of C or alignment, so its bits depend on its row of
// op(A), its column of op(B), alpha and beta alone. Must only be called when compiled.
void gemm_packed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc);

}  // namespace loom::kernels::cpu::detail
