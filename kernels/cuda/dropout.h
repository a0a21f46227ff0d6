// Counter-based dropout on device memory: the CUDA twin of kernels/cpu/dropout.h. The mask is
// bit-identical to the CPU's: element i is kept iff
//   philox::uniform01(philox::element_block(seed, rng_stream, offset + i).v[0]) >= p
// (p compared in f32) and kept elements are multiplied by the same f32 scale 1 / (1 - p), so f32
// outputs equal the CPU's bit for bit. bf16 elements are read into f32, multiplied and rounded
// once: equal to the CPU's f32 result on the same (rounded) inputs, then rounded.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda {

// y = mask * x / (1 - p), for n elements. x == y is allowed.
void dropout(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t rng_stream,
             uint64_t offset, Stream stream);
void dropout(const BFloat16* x, BFloat16* y, int64_t n, float p, uint64_t seed, uint64_t rng_stream,
             uint64_t offset, Stream stream);

}  // namespace loom::kernels::cuda
