// Elementwise math (exp log sqrt rsqrt abs neg tanh sin cos erf log1p expm1, pow, clamp) and
// selection (where, masked_fill); see core/ops.h. The formulas, forward and backward, are
// kernels/math.h's, shared by the CPU loops and the CUDA kernels. bf16/f16: See Note [Low-precision
// compute].
#include <cmath>

#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#include "kernels/cpu/math.h"
#include "kernels/cuda/math.h"

namespace loom {

namespace {

static_assert(int(Unary::kExp) == int(kernels::UnaryOp::kExp) &&
                  int(Unary::kLog) == int(kernels::UnaryOp::kLog) &&
                  int(Unary::kSqrt) == int(kernels::UnaryOp::kSqrt) &&
                  int(Unary::kRsqrt) == int(kernels::UnaryOp::kRsqrt) &&
                  int(Unary::kAbs) == int(kernels::UnaryOp::kAbs) &&
                  int(Unary::kNeg) == int(kernels::UnaryOp::kNeg) &&
                  int(Unary::kTanh) == int(kernels::UnaryOp::kTanh) &&
                  int(Unary::kSin) == int(kernels::UnaryOp::kSin) &&
                  int(Unary::kCos) == int(kernels::UnaryOp::kCos) &&
                  int(Unary::kErf) == int(kernels::UnaryOp::kErf) &&
                  int(Unary::kLog1p) == int(kernels::UnaryOp::kLog1p) &&
                  int(Unary::kExpm1) == int(kernels::UnaryOp::kExpm1) &&
                  int(Unary::kFloor) == int(kernels::UnaryOp::kFloor) &&
                  int(Unary::kCeil) == int(kernels::UnaryOp::kCeil) &&
                  int(Unary::kRound) == int(kernels::UnaryOp::kRound) &&
                  int(Unary::kTrunc) == int(kernels::UnaryOp::kTrunc),
              "core's Unary and kernels' UnaryOp list the functions in one order");

const char* unary_name(Unary op) {
  static const char* const names[] = {"exp",   "log",  "sqrt",  "rsqrt", "abs",   "neg",
                                      "tanh",  "sin",  "cos",   "erf",   "log1p", "expm1",
                                      "floor", "ceil", "round", "trunc"};
  return names[int(op)];
}

// out = f(x) elementwise on x's device: `cpu(x, out, n)` or `gpu(x, out, n, stream)`.
template <typename Cpu, typename Gpu>
Tensor map(const Tensor& x, Cpu cpu, Gpu gpu) {
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());
  if (in.numel() == 0) return out;
  if (in.device().is_cpu()) {
    cpu(in.data<float>(), out.data<float>(), in.numel());
  } else {
    LOOM_IF_CUDA(gpu(in.data<float>(), out.data<float>(), in.numel(), cuda_stream(in.device())));
  }
  (void)gpu;
  return out;
}

}  // namespace

Tensor unary(const Tensor& x, Unary op) {
  const char* name = unary_name(op);
  // Rounding an integer tensor leaves it as it is (PyTorch returns a copy).
  if (op >= Unary::kFloor && x.defined() && detail::is_integer(x.dtype())) return x.clone();
  const detail::LowPrecision lp(name, {{"x", x}});
  if (lp) return lp.round(unary(lp.f32(x), op));
  detail::check_f32(name, "x", x);
  const auto k = kernels::UnaryOp(int(op));
  Tensor out = map(
      x, [k](const float* in, float* o, int64_t n) { kernels::cpu::unary(in, o, n, k); },
      [k](const float* in, float* o, int64_t n, auto stream) {
        LOOM_IF_CUDA(kernels::cuda::unary(in, o, n, k, stream));
      });
  Tensor saved_x = x.detach().contiguous(), saved_y = out.detach();
  autograd::record(out, name, {x}, {saved_x, saved_y}, [saved_x, saved_y, k](const Tensor& grad) {
    Tensor g = grad.contiguous();
    Tensor dx = Tensor::empty(g.shape(), DType::kF32, g.device());
    const int64_t n = g.numel();
    if (n > 0 && g.device().is_cpu()) {
      kernels::cpu::unary_backward(saved_x.data<float>(), saved_y.data<float>(), g.data<float>(),
                                   dx.data<float>(), n, k);
    } else if (n > 0) {
      LOOM_IF_CUDA(kernels::cuda::unary_backward(saved_x.data<float>(), saved_y.data<float>(),
                                                 g.data<float>(), dx.data<float>(), n, k,
                                                 cuda_stream(g.device())));
    }
    return std::vector<Tensor>{dx};
  });
  return out;
}

Tensor pow(const Tensor& x, double exponent) {
  const detail::LowPrecision lp("pow", {{"x", x}});
  if (lp) return lp.round(pow(lp.f32(x), exponent));
  detail::check_f32("pow", "x", x);
  const float e = float(exponent);
  Tensor out = map(
      x, [e](const float* in, float* o, int64_t n) { kernels::cpu::pow(in, e, o, n); },
      [e](const float* in, float* o, int64_t n, auto stream) {
        LOOM_IF_CUDA(kernels::cuda::pow(in, e, o, n, stream));
      });
  Tensor saved_x = x.detach().contiguous();
  autograd::record(out, "pow", {x}, {saved_x}, [saved_x, e](const Tensor& grad) {
    Tensor g = grad.contiguous();
    Tensor dx = Tensor::empty(g.shape(), DType::kF32, g.device());
    const int64_t n = g.numel();
    if (n > 0 && g.device().is_cpu()) {
      kernels::cpu::pow_backward(saved_x.data<float>(), e, g.data<float>(), dx.data<float>(), n);
    } else if (n > 0) {
      LOOM_IF_CUDA(kernels::cuda::pow_backward(saved_x.data<float>(), e, g.data<float>(),
                                               dx.data<float>(), n, cuda_stream(g.device())));
    }
    return std::vector<Tensor>{dx};
  });
  return out;
}

Tensor clamp(const Tensor& x, double lo, double hi) {
  const detail::LowPrecision lp("clamp", {{"x", x}});
  if (lp) return lp.round(clamp(lp.f32(x), lo, hi));
  detail::check_f32("clamp", "x", x);
  LOOM_CHECK(!(std::isnan(lo) && std::isnan(hi)), "clamp: give at least one of min and max");
  const float l = float(lo), h = float(hi);
  Tensor out = map(
      x, [l, h](const float* in, float* o, int64_t n) { kernels::cpu::clamp(in, l, h, o, n); },
      [l, h](const float* in, float* o, int64_t n, auto stream) {
        LOOM_IF_CUDA(kernels::cuda::clamp(in, l, h, o, n, stream));
      });
  Tensor saved_x = x.detach().contiguous();
  autograd::record(out, "clamp", {x}, {saved_x}, [saved_x, l, h](const Tensor& grad) {
    Tensor g = grad.contiguous();
    Tensor dx = Tensor::empty(g.shape(), DType::kF32, g.device());
    const int64_t n = g.numel();
    if (n > 0 && g.device().is_cpu()) {
      kernels::cpu::clamp_backward(saved_x.data<float>(), l, h, g.data<float>(), dx.data<float>(),
                                   n);
    } else if (n > 0) {
      LOOM_IF_CUDA(kernels::cuda::clamp_backward(saved_x.data<float>(), l, h, g.data<float>(),
                                                 dx.data<float>(), n, cuda_stream(g.device())));
    }
    return std::vector<Tensor>{dx};
  });
  return out;
}

namespace {

// A bool or u8 mask's bytes (nonzero = true; bool holds 0 or 1).
const uint8_t* mask_bytes(const Tensor& mask) {
  LOOM_ASSERT(mask.dtype() == DType::kBool || mask.dtype() == DType::kU8, "mask of dtype ",
              dtype_name(mask.dtype()));
  return static_cast<const uint8_t*>(mask.data_ptr());
}

// condition ? a : b over contiguous operands of one shape (no autograd).
Tensor select(const Tensor& condition, const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), DType::kF32, a.device());
  const int64_t n = a.numel();
  if (n == 0) return out;
  if (a.device().is_cpu()) {
    kernels::cpu::select(mask_bytes(condition), a.data<float>(), b.data<float>(), out.data<float>(),
                         n);
  } else {
    LOOM_IF_CUDA(kernels::cuda::select(mask_bytes(condition), a.data<float>(), b.data<float>(),
                                       out.data<float>(), n, cuda_stream(a.device())));
  }
  return out;
}

}  // namespace

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  detail::check_defined("where", "condition", condition);
  LOOM_CHECK(condition.dtype() == DType::kBool || condition.dtype() == DType::kU8,
             "where: condition has dtype ", dtype_name(condition.dtype()),
             ", expected bool (a comparison's result) or u8 (nonzero = true); compare a tensor "
             "first, e.g. x > 0");
  detail::check_defined("where", "a", a);
  detail::check_defined("where", "b", b);
  if (auto out = detail::integer_where(condition, a, b)) return *out;
  const detail::LowPrecision lp("where", {{"a", a}, {"b", b}});
  if (lp) return lp.round(where(condition, lp.f32(a), lp.f32(b)));
  detail::check_f32("where", "a", a);
  detail::check_f32("where", "b", b);
  detail::check_same_device("where", "condition", condition, "a", a);
  detail::check_same_device("where", "a", a, "b", b);
  // The three are expanded to one shape (expand's backward sums the gradients back).
  const Shape shape = detail::broadcast_shape(
      "where", detail::broadcast_shape("where", condition.shape(), a.shape()), b.shape());
  auto full = [&](const Tensor& t) {
    return t.shape() == shape ? t.contiguous() : expand(t, shape);
  };
  const Tensor c = full(condition.detach()), x = full(a), y = full(b);
  Tensor out = select(c, x.detach(), y.detach());
  autograd::record(out, "where", {x, y}, {c}, [c](const Tensor& grad) {
    Tensor g = grad.contiguous();
    Tensor zero = Tensor::zeros(g.shape(), DType::kF32, g.device());
    return std::vector<Tensor>{select(c, g, zero), select(c, zero, g)};
  });
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  detail::check_defined("masked_fill", "x", x);
  detail::check_defined("masked_fill", "mask", mask);
  LOOM_CHECK(mask.dtype() == DType::kBool || mask.dtype() == DType::kU8,
             "masked_fill: mask has dtype ", dtype_name(mask.dtype()),
             ", expected bool (a comparison's result) or u8 (nonzero = fill)");
  const Shape shape = detail::broadcast_shape("masked_fill", x.shape(), mask.shape());
  LOOM_CHECK(shape == x.shape(), "masked_fill: mask ", shape_str(mask.shape()),
             " does not broadcast to x's shape ", shape_str(x.shape()));
  return where(mask, Tensor::scalar(value, x.dtype(), x.device()), x);
}

}  // namespace loom
