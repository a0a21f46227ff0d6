// sigmoid. The backward uses the saved output, y (1 - y), so nothing but y is kept.
#include "kernels/cpu/sigmoid.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/sigmoid.h"
#endif

namespace loom {

Tensor sigmoid(const Tensor& x) {
  const detail::LowPrecision lp("sigmoid", {{"x", x}});  // See Note [Low-precision compute]
  if (lp) return lp.round(sigmoid(lp.f32(x)));
  detail::check_f32("sigmoid", "x", x);
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());  // x's shape
  if (in.device().is_cpu()) {
    kernels::cpu::sigmoid_forward(in.data<float>(), out.data<float>(), in.numel());
  } else {
    LOOM_IF_CUDA(kernels::cuda::sigmoid_forward(in.data<float>(), out.data<float>(), in.numel(),
                                                cuda_stream(in.device())));
  }
  Tensor y = out.detach();  // not `out` itself: that would be a cycle (core/autograd.h)
  autograd::record(out, "sigmoid", {x}, {y}, [y](const Tensor& grad) {
    Tensor g = grad.contiguous();
    Tensor dx = Tensor::empty(y.shape(), DType::kF32, y.device());
    if (y.device().is_cpu()) {
      kernels::cpu::sigmoid_backward(y.data<float>(), g.data<float>(), dx.data<float>(), y.numel());
    } else {
      LOOM_IF_CUDA(kernels::cuda::sigmoid_backward(
          y.data<float>(), g.data<float>(), dx.data<float>(), y.numel(), cuda_stream(y.device())));
    }
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom
