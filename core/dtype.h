// Element types. bf16/f16 are storage formats: arithmetic on them accumulates in f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/numeric.h"

namespace loom {

// kBool is one byte holding 0 or 1 (C++ bool): comparisons return it, masks take it.
enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kU8, kBool };

size_t dtype_size(DType t);
const char* dtype_name(DType t);             // "f32", "bf16", ...
DType parse_dtype(const std::string& name);  // throws loom::Error naming the choices
bool is_floating(DType t);

// The DType of a C++ element type, for typed access (Tensor::data<T>()).
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};
static_assert(sizeof(bool) == 1, "loom's bool tensors are one byte per element");

}  // namespace loom
