#include "core/dtype.h"

#include "core/error.h"

namespace loom {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  LOOM_ASSERT(false, "unknown dtype ", int(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  for (DType t :
       {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8, DType::kBool})
    if (name == dtype_name(t)) return t;
  LOOM_FAIL("unknown dtype '", name, "' (expected one of f32, bf16, f16, i32, i64, u8, bool)");
}

bool is_floating(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

}  // namespace loom
