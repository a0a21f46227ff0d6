// Elementwise math on device memory: the CUDA twins of kernels/cpu/math.h (the same formulas,
// kernels/math.h).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/math.h"

namespace loom::kernels::cuda {

void unary(const float* x, float* y, int64_t n, UnaryOp op, Stream stream);
void unary_backward(const float* x, const float* y, const float* dy, float* dx, int64_t n,
                    UnaryOp op, Stream stream);
void pow(const float* x, float e, float* y, int64_t n, Stream stream);
void pow_backward(const float* x, float e, const float* dy, float* dx, int64_t n, Stream stream);
void clamp(const float* x, float lo, float hi, float* y, int64_t n, Stream stream);
void clamp_backward(const float* x, float lo, float hi, const float* dy, float* dx, int64_t n,
                    Stream stream);
void select(const uint8_t* condition, const float* a, const float* b, float* out, int64_t n,
            Stream stream);

}  // namespace loom::kernels::cuda
