// DLRM's pairwise dot interaction on device memory: the CUDA twin of
// kernels/cpu/dot_interaction.h (same arguments, same output order: out[b, i*(i-1)/2 + j] =
// <x[b,i], x[b,j]> for i > j, the lower triangle row by row; plus a trailing stream).
//
// Plain kernels rather than a batched GEMM x x^T and a gather, for the CPU's reasons: only the
// F(F-1)/2 kept dots are computed and nothing of size [B, F, F] is stored. The forward is one
// thread per output element, adding in the CPU's eight lanes combined in the CPU's order; the
// backward one thread per element of dx, adding over j ascending as the CPU does. Only FMA
// contraction can differ from the CPU, so results agree to f32 rounding, and they are
// bit-identical from run to run.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

// out [B, F*(F-1)/2] from x [B, F, D] (contiguous, row-major).
void dot_interaction_forward(const float* x, float* out, int64_t batch, int64_t features,
                             int64_t dim, Stream stream);

// Writes (=) dx [B, F, D]: dx[b,i] = sum over j != i of dout[b, pair(i,j)] x[b,j], j ascending.
// (With one feature there are no pairs and dx is all zeros.)
void dot_interaction_backward(const float* x, const float* dout, float* dx, int64_t batch,
                              int64_t features, int64_t dim, Stream stream);

}  // namespace loom::kernels::cuda
