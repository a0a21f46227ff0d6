// Layout and type conversions on raw host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/numeric.h"

namespace loom::kernels::cpu {

// Gathers a strided view (shape/strides in elements, ndim <= 16) into contiguous dst.
void strided_copy(const void* src, void* dst, size_t elem_size, int ndim, const int64_t* shape,
                  const int64_t* strides);
// The reverse: contiguous src into the strided view at dst (its elements must not overlap).
void strided_scatter(const void* src, void* dst, size_t elem_size, int ndim, const int64_t* shape,
                     const int64_t* strides);

// dst[positions[i]] = src[i] for i < n, elements of elem_size bytes (1, 2, 4 or 8); positions
// are distinct and in range (the caller checks), so the order does not matter.
void put_elements(const void* src, void* dst, size_t elem_size, const int64_t* positions,
                  int64_t n);

// Element conversion between any two of float, BFloat16, Float16, int32_t, int64_t, uint8_t,
// bool (to bool: not zero).
template <typename To, typename From>
inline To convert_scalar(From v) {
  if constexpr (std::is_same_v<From, BFloat16>) {
    return convert_scalar<To>(bf16_to_float(v));
  } else if constexpr (std::is_same_v<From, Float16>) {
    return convert_scalar<To>(f16_to_float(v));
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return float_to_bf16(float(v));
  } else if constexpr (std::is_same_v<To, Float16>) {
    return float_to_f16(float(v));
  } else {
    return static_cast<To>(v);
  }
}

template <typename To, typename From>
void convert(const From* src, To* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = convert_scalar<To>(src[i]);
}

}  // namespace loom::kernels::cpu
