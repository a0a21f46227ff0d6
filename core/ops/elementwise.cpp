// add / sub / mul / div / scale with numpy's broadcasting (see core/ops.h), and the
// in-place helpers optimizers use. bf16/f16: See Note [Low-precision compute].
#include "kernels/cpu/elementwise.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/norm_reduce.h"  // no CUDA header; called only under LOOM_IF_CUDA

namespace loom {

namespace {

enum class Binary { kAdd, kSub, kMul, kDiv };

Tensor binary_forward(Binary kind, const Tensor& a, const Tensor& b) {
  Tensor big = a.contiguous(), small = b.contiguous();
  bool swapped = false;
  if (a.shape() != b.shape() && detail::is_suffix(a.shape(), b.shape())) {
    std::swap(big, small);
    swapped = true;
  }
  Tensor out = Tensor::empty(big.shape(), DType::kF32, big.device());
  const int64_t n = big.numel(), nb = small.numel();
  if (n == 0) return out;
  const float* x = big.data<float>();
  const float* y = small.data<float>();
  float* o = out.data<float>();
  // The kernels broadcast their second operand, so a shorter `a` is swapped in as the second;
  // sub, the one non-commutative op, then negates (b - a = -(a' - b')).
  if (big.device().is_cpu()) {
    switch (kind) {
      case Binary::kAdd:
        kernels::cpu::add(x, y, o, n, nb);
        break;
      case Binary::kMul:
        kernels::cpu::mul(x, y, o, n, nb);
        break;
      case Binary::kSub:
        kernels::cpu::sub(x, y, o, n, nb);
        if (swapped) kernels::cpu::scale(o, -1.0f, o, n);
        break;
      case Binary::kDiv:
        LOOM_ASSERT(!swapped, "div: the dividend is never the broadcast operand here");
        kernels::cpu::div(x, y, o, n, nb);
        break;
    }
  } else {
    LOOM_IF_CUDA({
      auto stream = cuda_stream(big.device());
      switch (kind) {
        case Binary::kAdd:
          kernels::cuda::add(x, y, o, n, nb, stream);
          break;
        case Binary::kMul:
          kernels::cuda::mul(x, y, o, n, nb, stream);
          break;
        case Binary::kSub:
          kernels::cuda::sub(x, y, o, n, nb, stream);
          if (swapped) kernels::cuda::scale(o, -1.0f, o, n, stream);
          break;
        case Binary::kDiv:
          LOOM_ASSERT(!swapped, "div: the dividend is never the broadcast operand here");
          kernels::cuda::div(x, y, o, n, nb, stream);
          break;
      }
    });
  }
  return out;
}

void check_binary(const char* op, const Tensor& a, const Tensor& b) {
  detail::check_f32(op, "a", a);
  detail::check_f32(op, "b", b);
  detail::check_same_device(op, "a", a, "b", b);
}

// True when the kernels can broadcast a and b as they are (equal, or one a suffix of the other);
// otherwise the op expands them first (detail::broadcast_for_kernels) and calls itself.
bool kernels_broadcast(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() || detail::is_suffix(b.shape(), a.shape()) ||
         detail::is_suffix(a.shape(), b.shape());
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  if (auto integer = detail::integer_operands("add", a, b, &add)) return *integer;
  const detail::LowPrecision lp("add", {{"a", a}, {"b", b}});
  if (lp) return lp.round(add(lp.f32(a), lp.f32(b)));
  check_binary("add", a, b);
  if (!kernels_broadcast(a, b)) {
    const auto [x, y] = detail::broadcast_for_kernels("add", a, b);
    return add(x, y);
  }
  Tensor out = binary_forward(Binary::kAdd, a, b);
  Shape sa = a.shape(), sb = b.shape();
  autograd::record(out, "add", {a, b}, {}, [sa, sb](const Tensor& g) {
    return std::vector<Tensor>{detail::sum_to_suffix(g, sa), detail::sum_to_suffix(g, sb)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (auto integer = detail::integer_operands("sub", a, b, &sub)) return *integer;
  const detail::LowPrecision lp("sub", {{"a", a}, {"b", b}});
  if (lp) return lp.round(sub(lp.f32(a), lp.f32(b)));
  check_binary("sub", a, b);
  if (!kernels_broadcast(a, b)) {
    const auto [x, y] = detail::broadcast_for_kernels("sub", a, b);
    return sub(x, y);
  }
  Tensor out = binary_forward(Binary::kSub, a, b);
  Shape sa = a.shape(), sb = b.shape();
  autograd::record(out, "sub", {a, b}, {}, [sa, sb](const Tensor& g) {
    return std::vector<Tensor>{detail::sum_to_suffix(g, sa),
                               detail::sum_to_suffix(scale(g, -1.0), sb)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (auto integer = detail::integer_operands("mul", a, b, &mul)) return *integer;
  const detail::LowPrecision lp("mul", {{"a", a}, {"b", b}});
  if (lp) return lp.round(mul(lp.f32(a), lp.f32(b)));
  check_binary("mul", a, b);
  if (!kernels_broadcast(a, b)) {
    const auto [x, y] = detail::broadcast_for_kernels("mul", a, b);
    return mul(x, y);
  }
  Tensor out = binary_forward(Binary::kMul, a, b);
  Tensor sa = a.requires_grad() ? b.detach() : Tensor();  // saved only where a gradient needs it
  Tensor sb = b.requires_grad() ? a.detach() : Tensor();
  Shape shape_a = a.shape(), shape_b = b.shape();
  autograd::record(out, "mul", {a, b}, {sa, sb}, [sa, sb, shape_a, shape_b](const Tensor& g) {
    Tensor ga = sa.defined() ? detail::sum_to_suffix(mul(g, sa), shape_a) : Tensor();
    Tensor gb = sb.defined() ? detail::sum_to_suffix(mul(g, sb), shape_b) : Tensor();
    return std::vector<Tensor>{ga, gb};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (auto integer = detail::integer_operands("div", a, b, &div)) return *integer;
  const detail::LowPrecision lp("div", {{"a", a}, {"b", b}});
  if (lp) return lp.round(div(lp.f32(a), lp.f32(b)));
  check_binary("div", a, b);
  if (!kernels_broadcast(a, b)) {
    const auto [x, y] = detail::broadcast_for_kernels("div", a, b);
    return div(x, y);
  }
  // The kernels broadcast their second operand; a shorter dividend is first spread to b's shape
  // (times ones: exact, -0 and NaN kept), so the quotient is still one IEEE division.
  if (a.shape() != b.shape() && detail::is_suffix(a.shape(), b.shape()))
    return div(mul(Tensor::ones(b.shape(), DType::kF32, b.device()), a), b);
  Tensor out = binary_forward(Binary::kDiv, a, b);
  Tensor saved_b = b.detach(), saved_out = b.requires_grad() ? out.detach() : Tensor();
  Shape shape_a = a.shape(), shape_b = b.shape();
  autograd::record(out, "div", {a, b}, {saved_b, saved_out},
                   [saved_b, saved_out, shape_a, shape_b](const Tensor& g) {
                     // d(a/b)/da = 1/b; d(a/b)/db = -(a/b)/b.
                     Tensor ga = detail::sum_to_suffix(div(g, saved_b), shape_a);
                     Tensor gb = saved_out.defined()
                                     ? detail::sum_to_suffix(
                                           scale(div(mul(g, saved_out), saved_b), -1.0), shape_b)
                                     : Tensor();
                     return std::vector<Tensor>{ga, gb};
                   });
  return out;
}

Tensor scale(const Tensor& x, double s) {
  if (auto integer = detail::integer_scale(x, s)) return *integer;
  const detail::LowPrecision lp("scale", {{"x", x}});
  if (lp) return lp.round(scale(lp.f32(x), s));
  detail::check_f32("scale", "x", x);
  Tensor in = x.contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());
  if (in.device().is_cpu()) {
    kernels::cpu::scale(in.data<float>(), float(s), out.data<float>(), in.numel());
  } else {
    LOOM_IF_CUDA(kernels::cuda::scale(in.data<float>(), float(s), out.data<float>(), in.numel(),
                                      cuda_stream(in.device())));
  }
  autograd::record(out, "scale", {x}, {},
                   [s](const Tensor& g) { return std::vector<Tensor>{scale(g, s)}; });
  return out;
}

void add_(Tensor& x, const Tensor& y, double alpha) {
  const detail::LowPrecision lp("add_", {{"x", x}, {"y", y}});
  detail::check_defined("add_", "x", x);
  detail::check_defined("add_", "y", y);
  detail::check_same_device("add_", "x", x, "y", y);
  LOOM_CHECK(x.shape() == y.shape(), "add_: shapes ", shape_str(x.shape()), " and ",
             shape_str(y.shape()), " differ");
  if (!x.is_contiguous()) {  // a strided view (t.T += y): the sum, written back through it
    Tensor sum = x.detach().contiguous();
    add_(sum, y, alpha);
    x.copy_(sum);
    return;
  }
  if (lp) {  // x keeps its dtype: rounded back into a bf16/f16 x, left f32 otherwise
    detail::LowPrecision::update(
        x, [&](Tensor& x32) { add_(x32, detail::LowPrecision::f32(y.detach()), alpha); });
    return;
  }
  Tensor in = y.detach().contiguous();
  x.storage()->bump_version();  // See Note [Version counter]
  if (x.device().is_cpu()) {
    kernels::cpu::axpy(x.data<float>(), in.data<float>(), float(alpha), x.numel());
  } else {
    LOOM_IF_CUDA(kernels::cuda::axpy(x.data<float>(), in.data<float>(), float(alpha), x.numel(),
                                     cuda_stream(x.device())));
  }
}

void scale_(Tensor& x, double s) {
  const detail::LowPrecision lp("scale_", {{"x", x}});
  detail::check_defined("scale_", "x", x);
  if (!x.is_contiguous()) {  // a strided view: the product, written back through it
    Tensor product = x.detach().contiguous();
    scale_(product, s);
    x.copy_(product);
    return;
  }
  if (lp) {
    detail::LowPrecision::update(x, [s](Tensor& x32) { scale_(x32, s); });
    return;
  }
  x.storage()->bump_version();  // See Note [Version counter]
  if (x.device().is_cpu()) {
    kernels::cpu::scale(x.data<float>(), float(s), x.data<float>(), x.numel());
  } else {
    LOOM_IF_CUDA(kernels::cuda::scale(x.data<float>(), float(s), x.data<float>(), x.numel(),
                                      cuda_stream(x.device())));
  }
}

double sum_of_squares(const Tensor& x) {
  // bf16/f16 values are exact in f32, so the upcast changes nothing but the storage.
  const detail::LowPrecision lp("sum_of_squares", {{"x", x}});
  if (lp) return sum_of_squares(detail::LowPrecision::f32(x.detach()));
  detail::check_f32("sum_of_squares", "x", x);
  Tensor in = x.detach().contiguous();
  if (in.device().is_cpu()) return kernels::cpu::sum_of_squares(in.data<float>(), in.numel());
  double result = 0.0;
  LOOM_IF_CUDA({
    const Device device = in.device();
    const size_t bytes = kernels::cuda::sum_of_squares_workspace_bytes(in.numel());
    Tensor ws = cuda_workspace(device, bytes);
    Tensor out = cuda_workspace(device, sizeof(double));
    kernels::cuda::sum_of_squares(in.data<float>(), in.numel(),
                                  static_cast<double*>(out.data_ptr()), ws.data_ptr(), bytes,
                                  cuda_stream(device));
    out.copy_to_host(&result, sizeof(result));  // the one read back
  });
  return result;
}

}  // namespace loom
