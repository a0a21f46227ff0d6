// Elementwise kernels on device memory: the CUDA twins of kernels/cpu/elementwise.h, with the
// same broadcasting rule (b repeats every nb elements of a).
#pragma once

#include <cstdint>

#include "kernels/compare.h"
#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

void add(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream);
void sub(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream);
void mul(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream);
void div(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream);
void compare(const float* a, const float* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op,
             Stream stream);
void compare(const int32_t* a, const int32_t* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op,
             Stream stream);
void compare(const int64_t* a, const int64_t* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op,
             Stream stream);
void compare(const uint8_t* a, const uint8_t* b, uint8_t* out, int64_t n, int64_t nb, CompareOp op,
             Stream stream);
void scale(const float* x, float s, float* out, int64_t n, Stream stream);
void axpy(float* x, const float* y, float alpha, int64_t n, Stream stream);
void sum_rows(const float* x, float* out, int64_t rows, int64_t cols, Stream stream);
// The sum of squares is in kernels/cuda/norm_reduce.h (device result, caller's workspace).

}  // namespace loom::kernels::cuda
