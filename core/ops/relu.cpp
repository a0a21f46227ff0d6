// relu. The backward reads the saved input (x > 0), not the output, so a caller modifying the
// output cannot change the gradient.
#include "kernels/cpu/relu.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"

namespace loom {

Tensor relu(const Tensor& x) {
  const detail::LowPrecision lp("relu", {{"x", x}});  // See Note [Low-precision compute]
  if (lp) return lp.round(relu(lp.f32(x)));
  detail::check_f32("relu", "x", x);
  LOOM_CHECK(x.device().is_cpu(), "relu: CUDA kernel not implemented yet (CPU only for now)");
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());  // x's shape
  kernels::cpu::relu_forward(in.data<float>(), out.data<float>(), in.numel());
  autograd::record(out, "relu", {x}, [in](const Tensor& grad) {
    Tensor g = grad.contiguous();
    Tensor dx = Tensor::empty(in.shape(), DType::kF32, in.device());
    kernels::cpu::relu_backward(in.data<float>(), g.data<float>(), dx.data<float>(), in.numel());
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom
