// Calls f(T{}) with the C++ element type of a DType, so a templated body serves every type.
#pragma once

#include "core/dtype.h"
#include "core/error.h"

namespace loom {

template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(BFloat16{});
    case DType::kF16:
      return f(Float16{});
    case DType::kI32:
      return f(int32_t{});
    case DType::kI64:
      return f(int64_t{});
    case DType::kU8:
      return f(uint8_t{});
    case DType::kBool:
      return f(bool{});
  }
  LOOM_ASSERT(false, "unknown dtype ", int(t));
}

// Calls f(I{}) with the C++ type of an index dtype (i32 or i64); any other dtype is an internal
// error, since ops check index dtypes (detail::check_index) before dispatching.
template <typename F>
void visit_index_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kI32:
      return f(int32_t{});
    case DType::kI64:
      return f(int64_t{});
    default:
      LOOM_ASSERT(false, "visit_index_dtype: ", dtype_name(t), " is not an index dtype");
  }
}

}  // namespace loom
