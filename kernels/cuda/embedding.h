// Embedding lookup on CUDA: the twin of kernels/cpu/embedding.h. out[i, :] = weight[indices[i], :]
// for weight [vocab, cols], and its deterministic backward, on device memory with a trailing
// stream. Indices must already be checked to lie in [0, vocab) (as on the CPU).
//
// Where this differs from the CPU interface:
// - The forward also takes bf16 weight and out (a copy: no rounding); indices int32 or int64.
// - The backward needs scratch (the radix sort's buffers): ask embedding_backward_workspace_bytes
//   and pass at least that many bytes of device memory (any allocation from the device
//   allocator; 4-byte aligned). dweight is f32 (a parameter gradient); dout is f32 or bf16.
// - At most 2^31-1 lookups per call and a vocabulary of at most 2^31-1 rows (32-bit sort keys
//   and positions); larger calls are a loom::Error.
//
// Functions with a T or I are templates instantiated for T in {float, BFloat16} and I in
// {int32_t, int64_t}.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda {

template <typename T, typename I>
void embedding_forward(const T* weight, const I* indices, T* out, int64_t n, int64_t cols,
                       Stream stream);

// Bytes of workspace embedding_backward needs for n lookups into a vocabulary of vocab rows
// (0 when n is 0).
size_t embedding_backward_workspace_bytes(int64_t n, int64_t vocab);

// Writes (=) all of dweight [vocab, cols]: row v is the sum of dout[i, :] over the i with
// indices[i] == v, added in increasing i (as the CPU does, so the result is bit-identical to the
// CPU's and from run to run); rows no index names are zero.
template <typename T, typename I>
void embedding_backward(const T* dout, const I* indices, float* dweight, int64_t n, int64_t vocab,
                        int64_t cols, void* workspace, size_t workspace_bytes, Stream stream);

}  // namespace loom::kernels::cuda
