// DLRM's pairwise dot interaction: for each sample b of features x [B, F, D], the dot products of
// distinct feature vectors, out [B, F*(F-1)/2], in the order of the strictly lower triangle of
// x_b x_b^T read row by row:
//   (1,0), (2,0), (2,1), (3,0), (3,1), (3,2), ...   i.e. out[b, i*(i-1)/2 + j] = <x[b,i], x[b,j]>
// for i > j. This is the order of the DLRM reference (dlrm_s_pytorch.py gathers Z[:, li, lj] with
// li, lj looping over i, then j < i), so a top MLP's input columns line up with its. (TorchRec
// reads the upper triangle row by row instead: the same numbers in another order.)
//
// A dedicated kernel rather than matmul(x, x^T) and a gather: it computes only the F(F-1)/2 dots
// the output keeps instead of all F^2, stores nothing of size [B, F, F], and the backward is one
// pass over x.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// Index of the pair (i, j), i > j, in a row of the output.
inline int64_t dot_interaction_index(int64_t i, int64_t j) { return i * (i - 1) / 2 + j; }

// out [B, F*(F-1)/2] from x [B, F, D] (contiguous, row-major).
void dot_interaction_forward(const float* x, float* out, int64_t batch, int64_t features,
                             int64_t dim);

// Writes (=) dx [B, F, D]: dx[b,i] = sum over j != i of dout[b, pair(i,j)] x[b,j], j ascending.
void dot_interaction_backward(const float* x, const float* dout, float* dx, int64_t batch,
                              int64_t features, int64_t dim);

}  // namespace loom::kernels::cpu
