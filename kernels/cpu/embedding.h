// Embedding lookup: out[i, :] = weight[indices[i], :] for weight [vocab, cols] f32, and its
// backward. Indices must already be checked to lie in [0, vocab).
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

void embedding_forward(const float* weight, const int32_t* indices, float* out, int64_t n,
                       int64_t cols);
void embedding_forward(const float* weight, const int64_t* indices, float* out, int64_t n,
                       int64_t cols);

// Writes (=) all of dweight [vocab, cols]: row v is the sum of dout[i, :] over the i with
// indices[i] == v, added in increasing i whatever the thread count (deterministic); rows no
// index names are zero.
void embedding_backward(const float* dout, const int32_t* indices, float* dweight, int64_t n,
                        int64_t vocab, int64_t cols);
void embedding_backward(const float* dout, const int64_t* indices, float* dweight, int64_t n,
                        int64_t vocab, int64_t cols);

}  // namespace loom::kernels::cpu
