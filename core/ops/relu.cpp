// relu. The backward reads the saved input (x > 0), not the output, so a caller modifying the
// output cannot change the gradient.
#include "kernels/cpu/relu.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/relu.h"
#endif

namespace loom {

Tensor relu(const Tensor& x) {
  const detail::LowPrecision lp("relu", {{"x", x}});  // See Note [Low-precision compute]
  if (lp) return lp.round(relu(lp.f32(x)));
  detail::check_f32("relu", "x", x);
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());  // x's shape
  if (in.device().is_cpu()) {
    kernels::cpu::relu_forward(in.data<float>(), out.data<float>(), in.numel());
  } else {
    LOOM_IF_CUDA(kernels::cuda::relu_forward(in.data<float>(), out.data<float>(), in.numel(),
                                             cuda_stream(in.device())));
  }
  autograd::record(out, "relu", {x}, {in}, [in](const Tensor& grad) {
    Tensor g = grad.contiguous();
    Tensor dx = Tensor::empty(in.shape(), DType::kF32, in.device());
    if (in.device().is_cpu()) {
      kernels::cpu::relu_backward(in.data<float>(), g.data<float>(), dx.data<float>(), in.numel());
    } else {
      LOOM_IF_CUDA(kernels::cuda::relu_backward(in.data<float>(), g.data<float>(), dx.data<float>(),
                                                in.numel(), cuda_stream(in.device())));
    }
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom
