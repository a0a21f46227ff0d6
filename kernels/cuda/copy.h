// Layout and type conversions on device memory (the CUDA twins of kernels/cpu/copy.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda {

// Gathers a strided view (ndim <= 16, shape/strides in elements) into contiguous dst.
void strided_copy(const void* src, void* dst, size_t elem_size, int ndim, const int64_t* shape,
                  const int64_t* strides, Stream stream);
// The reverse: contiguous src into the strided view at dst (its elements must not overlap).
void strided_scatter(const void* src, void* dst, size_t elem_size, int ndim, const int64_t* shape,
                     const int64_t* strides, Stream stream);

// dst[positions[i]] = src[i] for i < n (positions on the device, distinct and in range).
void put_elements(const void* src, void* dst, size_t elem_size, const int64_t* positions, int64_t n,
                  Stream stream);

// Element type codes for convert(): 0 f32, 1 bf16, 2 f16, 3 i32, 4 i64, 5 u8, 6 bool (DType's
// order; to bool is "not zero", as C++'s conversion).
void convert(const void* src, int src_type, void* dst, int dst_type, int64_t n, Stream stream);

// Sets n elements of size elem_size to the bit pattern at `value`.
void fill(void* dst, const void* value, size_t elem_size, int64_t n, Stream stream);

}  // namespace loom::kernels::cuda
