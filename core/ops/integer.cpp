// Integer arithmetic, integer sums and float/integer promotion (core/ops.h). add, sub, mul, div,
// scale and sum route here when an operand is an integer tensor (See Note [Integer operands]).
//
// Note [Integer operands]
// PyTorch's rules, for the dtypes loom has: two integer tensors of one dtype add, subtract and
// multiply in that dtype (wrapping); integers of two dtypes meet in i64; a floating tensor with an
// integer one computes in the floating dtype (the integer converted, exact below 2^24 in f32);
// true division (div, t / number) of integers is f32; t * number stays integer when the number
// is integral, else f32. floor_divide / remainder are integer-only. sum of an integer tensor is
// i64. Integer results have no autograd (integers carry no gradient).
#include <cmath>

#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "kernels/cpu/integer.h"
#include "kernels/cuda/integer.h"

namespace loom {

namespace detail {

bool is_integer(DType dtype) {
  return dtype == DType::kI32 || dtype == DType::kI64 || dtype == DType::kU8 ||
         dtype == DType::kBool;
}

}  // namespace detail

namespace {

using kernels::IntegerOp;

template <typename T>
void run_op(const Tensor& a, const Tensor& b, Tensor& out, IntegerOp op) {
  const int64_t n = a.numel(), nb = b.numel();
  if (a.device().is_cpu()) {
    kernels::cpu::integer_op(a.data<T>(), b.data<T>(), out.data<T>(), n, nb, op);
  } else {
    LOOM_IF_CUDA(kernels::cuda::integer_op(a.data<T>(), b.data<T>(), out.data<T>(), n, nb, op,
                                           cuda_stream(a.device())));
  }
}

// a op b for integer tensors of one dtype, with add's broadcasting.
Tensor integer_binary(const char* name, Tensor a, Tensor b, IntegerOp op) {
  detail::check_same_device(name, "a", a, "b", b);
  if (a.dtype() == DType::kBool && b.dtype() == DType::kBool) {
    // As PyTorch's: + is or and * is and; the others have no bool meaning.
    LOOM_CHECK(op == IntegerOp::kAdd || op == IntegerOp::kMul, name,
               " of two bool tensors is not defined (PyTorch refuses it too): use logical_xor or "
               "~ for bools, or convert them first (t.long())");
    return integer_binary(name, a.to(DType::kU8), b.to(DType::kU8), op).to(DType::kBool);
  }
  if (a.dtype() == DType::kBool) a = a.to(b.dtype());  // a bool meets another integer as 0 / 1
  if (b.dtype() == DType::kBool) b = b.to(a.dtype());
  if (a.dtype() != b.dtype()) {  // two integer dtypes meet in i64
    a = a.to(DType::kI64);
    b = b.to(DType::kI64);
  }
  a = a.detach();
  b = b.detach();
  if (a.shape() != b.shape() && !detail::is_suffix(b.shape(), a.shape())) {
    // The kernels repeat their second operand; anything else is expanded to the result's shape.
    const Shape to = detail::broadcast_shape(name, a.shape(), b.shape());
    if (a.shape() != to) a = expand(a, to);
    if (b.shape() != to && !detail::is_suffix(b.shape(), to)) b = expand(b, to);
  }
  if (op == IntegerOp::kFloorDiv || op == IntegerOp::kRemainder) {
    const Tensor zeros = compare(b, Tensor::scalar(0.0, b.dtype(), b.device()), Compare::kEq);
    LOOM_CHECK(sum(zeros).item() == 0.0, name, ": integer division by zero (a divisor holds 0)");
  }
  a = a.contiguous();
  b = b.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (out.numel() == 0) return out;
  switch (a.dtype()) {
    case DType::kI32:
      run_op<int32_t>(a, b, out, op);
      break;
    case DType::kU8:
      run_op<uint8_t>(a, b, out, op);
      break;
    default:
      run_op<int64_t>(a, b, out, op);
      break;
  }
  return out;
}

template <typename T>
void run_sum(const Tensor& x, Tensor& out, int64_t outer, int64_t size, int64_t inner) {
  if (x.device().is_cpu()) {
    kernels::cpu::integer_sum(x.data<T>(), out.data<int64_t>(), outer, size, inner);
  } else {
    LOOM_IF_CUDA(kernels::cuda::integer_sum(x.data<T>(), out.data<int64_t>(), outer, size, inner,
                                            cuda_stream(x.device())));
  }
}

// x viewed as [outer, size, inner] summed over size into i64 [outer, inner].
Tensor integer_sum(const Tensor& x, int64_t outer, int64_t size, int64_t inner,
                   const Shape& shape) {
  Tensor in = x.dtype() == DType::kBool ? x.detach().to(DType::kU8) : x.detach().contiguous();
  Tensor out = Tensor::empty(shape, DType::kI64, x.device());
  if (out.numel() == 0) return out;
  switch (in.dtype()) {
    case DType::kI32:
      run_sum<int32_t>(in, out, outer, size, inner);
      break;
    case DType::kU8:
      run_sum<uint8_t>(in, out, outer, size, inner);
      break;
    default:
      run_sum<int64_t>(in, out, outer, size, inner);
      break;
  }
  return out;
}

}  // namespace

namespace detail {

std::optional<Tensor> integer_operands(const char* name, const Tensor& a, const Tensor& b,
                                       Tensor (*float_op)(const Tensor&, const Tensor&)) {
  if (!a.defined() || !b.defined()) return std::nullopt;
  const bool ia = is_integer(a.dtype()), ib = is_integer(b.dtype());
  if (!ia && !ib) return std::nullopt;
  const std::string op = name;
  const bool true_division = op == "div";
  if (ia && ib && !true_division) {
    const IntegerOp k = op == "add"   ? IntegerOp::kAdd
                        : op == "sub" ? IntegerOp::kSub
                                      : IntegerOp::kMul;
    return integer_binary(name, a, b, k);
  }
  // Promotion: the integer side converted to the floating side's dtype (f32 for two integers
  // under true division).
  const DType to = !ia ? a.dtype() : !ib ? b.dtype() : DType::kF32;
  return float_op(ia ? a.to(to) : a, ib ? b.to(to) : b);
}

std::optional<Tensor> integer_scale(const Tensor& x, double s) {
  if (!x.defined() || !is_integer(x.dtype())) return std::nullopt;
  if (x.dtype() == DType::kBool) return integer_scale(x.to(DType::kI64), s);  // as PyTorch: i64
  if (!(std::isfinite(s) && s == std::floor(s) && std::fabs(s) < 9.2e18))
    return scale(x.to(DType::kF32), s);  // t * 0.5: true arithmetic, in f32
  // An integral factor the dtype cannot hold (u8 * -1) is applied in i64 and wrapped back, as
  // PyTorch wraps it: converting it straight to the dtype would be undefined.
  const bool fits =
      x.dtype() == DType::kI64 ||
      (x.dtype() == DType::kU8 ? s >= 0 && s <= 255 : s >= -2147483648.0 && s <= 2147483647.0);
  if (fits)
    return integer_binary("mul", x, Tensor::scalar(s, x.dtype(), x.device()), IntegerOp::kMul);
  return integer_binary("mul", x.to(DType::kI64), Tensor::scalar(s, DType::kI64, x.device()),
                        IntegerOp::kMul)
      .to(x.dtype());
}

std::optional<Tensor> integer_sum_all(const Tensor& x) {
  if (!x.defined() || !is_integer(x.dtype())) return std::nullopt;
  return integer_sum(x, 1, x.numel(), 1, Shape{});
}

std::optional<Tensor> integer_sum_dim(const Tensor& x, int64_t dim, bool keepdim) {
  if (!x.defined() || !is_integer(x.dtype())) return std::nullopt;
  LOOM_CHECK(dim >= -x.dim() && dim < x.dim(), "sum: dim ", dim, " out of range for a ", x.dim(),
             "-D tensor");
  if (dim < 0) dim += x.dim();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  Shape shape = x.shape();
  if (keepdim)
    shape[size_t(dim)] = 1;
  else
    shape.erase(shape.begin() + dim);
  return integer_sum(x, outer, x.size(dim), inner, shape);
}

std::optional<Tensor> integer_where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  const bool ia = is_integer(a.dtype()), ib = is_integer(b.dtype());
  if (!ia && !ib) return std::nullopt;
  if (!ia || !ib) {  // the floating side's dtype, and its gradient
    const DType to = ia ? b.dtype() : a.dtype();
    return where(condition, ia ? a.to(to) : a, ib ? b.to(to) : b);
  }
  if (a.dtype() == DType::kBool && b.dtype() == DType::kBool)  // picked as bytes, bool again
    return integer_where(condition, a.to(DType::kU8), b.to(DType::kU8))->to(DType::kBool);
  // a * c + b * (1 - c), c the condition as 0 / 1 of the dtype: every product is a value times
  // 0 or 1, so nothing wraps and the picked values are exact.
  const DType to = a.dtype() == b.dtype() ? a.dtype() : DType::kI64;
  const Tensor c = condition.to(to);
  const Tensor not_c =
      integer_binary("where", Tensor::scalar(1.0, to, c.device()), c, IntegerOp::kSub);
  return integer_binary("where", integer_binary("where", a.to(to), c, IntegerOp::kMul),
                        integer_binary("where", b.to(to), not_c, IntegerOp::kMul), IntegerOp::kAdd);
}

}  // namespace detail

Tensor floor_divide(const Tensor& a, const Tensor& b) {
  detail::check_defined("floor_divide", "a", a);
  detail::check_defined("floor_divide", "b", b);
  LOOM_CHECK(detail::is_integer(a.dtype()) && detail::is_integer(b.dtype()),
             "floor_divide: integer tensors only (i32, i64, u8), got ", dtype_name(a.dtype()),
             " and ", dtype_name(b.dtype()));
  return integer_binary("floor_divide", a, b, IntegerOp::kFloorDiv);
}

Tensor remainder(const Tensor& a, const Tensor& b) {
  detail::check_defined("remainder", "a", a);
  detail::check_defined("remainder", "b", b);
  LOOM_CHECK(detail::is_integer(a.dtype()) && detail::is_integer(b.dtype()),
             "remainder: integer tensors only (i32, i64, u8), got ", dtype_name(a.dtype()), " and ",
             dtype_name(b.dtype()));
  return integer_binary("remainder", a, b, IntegerOp::kRemainder);
}

}  // namespace loom
