// sigmoid. The backward uses the saved output, y (1 - y), so nothing but y is kept.
#include "kernels/cpu/sigmoid.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"

namespace loom {

Tensor sigmoid(const Tensor& x) {
  const detail::LowPrecision lp("sigmoid", {{"x", x}});  // See Note [Low-precision compute]
  if (lp) return lp.round(sigmoid(lp.f32(x)));
  detail::check_f32("sigmoid", "x", x);
  LOOM_CHECK(x.device().is_cpu(), "sigmoid: CUDA kernel not implemented yet (CPU only for now)");
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());  // x's shape
  kernels::cpu::sigmoid_forward(in.data<float>(), out.data<float>(), in.numel());
  Tensor y = out.detach();  // not `out` itself: that would be a cycle (core/autograd.h)
  autograd::record(out, "sigmoid", {x}, [y](const Tensor& grad) {
    Tensor g = grad.contiguous();
    Tensor dx = Tensor::empty(y.shape(), DType::kF32, y.device());
    kernels::cpu::sigmoid_backward(y.data<float>(), g.data<float>(), dx.data<float>(), y.numel());
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom
