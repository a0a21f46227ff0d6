// Integer kernels on host memory (kernels/integer.h): elementwise arithmetic with the elementwise
// kernels' broadcasting (b repeats every nb elements of a), and sums into int64.
#pragma once

#include <cstdint>

#include "kernels/integer.h"

namespace loom::kernels::cpu {

void integer_op(const int32_t* a, const int32_t* b, int32_t* out, int64_t n, int64_t nb,
                IntegerOp op);
void integer_op(const int64_t* a, const int64_t* b, int64_t* out, int64_t n, int64_t nb,
                IntegerOp op);
void integer_op(const uint8_t* a, const uint8_t* b, uint8_t* out, int64_t n, int64_t nb,
                IntegerOp op);

// x viewed as [outer, size, inner] -> out [outer, inner]: the sum over `size` (exact; wraps past
// int64).
void integer_sum(const int32_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner);
void integer_sum(const int64_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner);
void integer_sum(const uint8_t* x, int64_t* out, int64_t outer, int64_t size, int64_t inner);

}  // namespace loom::kernels::cpu
