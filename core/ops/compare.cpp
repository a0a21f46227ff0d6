// compare(): elementwise comparisons into a bool tensor (see core/ops.h). The kernels broadcast
// their second operand, so a shorter `a` is swapped in as the second and the comparison mirrored
// (a < b is b > a).
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"

namespace loom {

namespace {

// The two enums list the comparisons in one order (checked here), so the cast is exact.
static_assert(int(Compare::kEq) == int(kernels::CompareOp::kEq) &&
                  int(Compare::kNe) == int(kernels::CompareOp::kNe) &&
                  int(Compare::kLt) == int(kernels::CompareOp::kLt) &&
                  int(Compare::kLe) == int(kernels::CompareOp::kLe) &&
                  int(Compare::kGt) == int(kernels::CompareOp::kGt) &&
                  int(Compare::kGe) == int(kernels::CompareOp::kGe),
              "core's Compare and kernels' CompareOp list the comparisons in one order");
kernels::CompareOp kernel_op(Compare op) { return kernels::CompareOp(int(op)); }

// b op a for a op b.
Compare mirrored(Compare op) {
  switch (op) {
    case Compare::kLt:
      return Compare::kGt;
    case Compare::kLe:
      return Compare::kGe;
    case Compare::kGt:
      return Compare::kLt;
    case Compare::kGe:
      return Compare::kLe;
    default:
      return op;  // eq and ne are symmetric
  }
}

// T is the element type the kernels compare as (bool tensors as their bytes, uint8_t).
template <typename T>
void run(const Tensor& big, const Tensor& small, Tensor& out, Compare op) {
  const T* x = static_cast<const T*>(big.data_ptr());
  const T* y = static_cast<const T*>(small.data_ptr());
  uint8_t* o = static_cast<uint8_t*>(out.data_ptr());  // bool: one byte, 0 or 1
  const int64_t n = big.numel(), nb = small.numel();
  if (big.device().is_cpu()) {
    kernels::cpu::compare(x, y, o, n, nb, kernel_op(op));
  } else {
    LOOM_IF_CUDA(kernels::cuda::compare(x, y, o, n, nb, kernel_op(op), cuda_stream(big.device())));
  }
}

}  // namespace

Tensor compare(const Tensor& a, const Tensor& b, Compare op) {
  constexpr const char* name = "compare";
  detail::check_defined(name, "a", a);
  detail::check_defined(name, "b", b);
  detail::check_same_device(name, "a", a, "b", b);
  if (a.dtype() != b.dtype()) {  // promoted as PyTorch's: integers (bool too) meet in i64, an
                                 // integer and a float in the float's dtype, two floats in f32
    const bool ia = detail::is_integer(a.dtype()), ib = detail::is_integer(b.dtype());
    const DType to = ia && ib ? DType::kI64 : ia ? b.dtype() : ib ? a.dtype() : DType::kF32;
    return compare(a.detach().to(to), b.detach().to(to), op);
  }
  if (a.shape() != b.shape() && !detail::is_suffix(b.shape(), a.shape()) &&
      !detail::is_suffix(a.shape(), b.shape())) {  // expanded first: the kernels repeat a suffix
    const auto [x, y] = detail::broadcast_for_kernels(name, a.detach(), b.detach());
    return compare(x, y, op);
  }
  if (a.dtype() == DType::kBF16 || a.dtype() == DType::kF16)  // every value exact in f32
    return compare(a.detach().to(DType::kF32), b.detach().to(DType::kF32), op);
  LOOM_CHECK(a.dtype() == DType::kF32 || a.dtype() == DType::kI32 || a.dtype() == DType::kI64 ||
                 a.dtype() == DType::kU8 || a.dtype() == DType::kBool,
             name, ": ", dtype_name(a.dtype()),
             " tensors cannot be compared (f32, bf16, f16, i32, i64, u8, bool)");
  Tensor big = a.detach().contiguous(), small = b.detach().contiguous();
  if (a.shape() != b.shape() && detail::is_suffix(a.shape(), b.shape())) {
    std::swap(big, small);
    op = mirrored(op);
  }
  Tensor out = Tensor::empty(big.shape(), DType::kBool, big.device());
  if (out.numel() == 0) return out;
  switch (big.dtype()) {
    case DType::kF32:
      run<float>(big, small, out, op);
      break;
    case DType::kI32:
      run<int32_t>(big, small, out, op);
      break;
    case DType::kU8:
    case DType::kBool:
      run<uint8_t>(big, small, out, op);
      break;
    default:
      run<int64_t>(big, small, out, op);
      break;
  }
  return out;
}

}  // namespace loom
