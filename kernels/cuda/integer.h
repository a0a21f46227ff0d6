// Integer kernels on device memory: the CUDA twins of kernels/cpu/integer.h (the same arithmetic,
// kernels/integer.h, and broadcasting). The sums add with 64-bit integer atomics: integer
// addition is associative, so the result is exact and does not depend on the order.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/integer.h"

namespace loom::kernels::cuda {

void integer_op(const int32_t* a, const int32_t* b, int32_t* out, int64_t n, int64_t nb,
                IntegerOp op, Stream stream);
void integer_op(const int64_t* a, const int64_t* b, int64_t* out, int64_t n, int64_t nb,
                IntegerOp op, Stream stream);
void integer_op(const uint8_t* a, const uint8_t* b, uint8_t* out, int64_t n, int64_t nb,
                IntegerOp op, Stream stream);

// out [outer, inner] (zeroed here first) = the sum of x [outer, size, inner] over `size`.
void integer_sum(const int32_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner,
                 Stream stream);
void integer_sum(const int64_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner,
                 Stream stream);
void integer_sum(const uint8_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner,
                 Stream stream);

}  // namespace loom::kernels::cuda
