// gelu (GPT-2's tanh approximation). The backward recomputes gelu'(x) from the saved input
// rather than saving anything extra.
#include "kernels/cpu/gelu.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#include "kernels/cuda/gelu.h"

namespace loom {

namespace {

Tensor gelu_backward(const Tensor& x, const Tensor& grad) {
  Tensor g = grad.contiguous();
  Tensor dx = Tensor::empty(x.shape(), DType::kF32, x.device());
  if (x.device().is_cpu()) {
    kernels::cpu::gelu_backward(x.data<float>(), g.data<float>(), dx.data<float>(), x.numel());
  } else {
    LOOM_IF_CUDA(kernels::cuda::gelu_backward(x.data<float>(), g.data<float>(), dx.data<float>(),
                                              x.numel(), cuda_stream(x.device())));
  }
  return dx;
}

// gelu on a bf16 CUDA tensor through the kernels' bf16 overloads (Note [bf16 kernels on CUDA]).
Tensor gelu_cuda_bf16(const Tensor& x) {
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kBF16, in.device());
  LOOM_IF_CUDA(kernels::cuda::gelu_forward(in.data<BFloat16>(), out.data<BFloat16>(), in.numel(),
                                           cuda_stream(in.device())));
  autograd::record(out, "gelu", {x}, {in}, [in](const Tensor& grad) {
    Tensor g = grad.to(DType::kBF16).contiguous();
    Tensor dx = Tensor::empty(in.shape(), DType::kBF16, in.device());
    LOOM_IF_CUDA(kernels::cuda::gelu_backward(in.data<BFloat16>(), g.data<BFloat16>(),
                                              dx.data<BFloat16>(), in.numel(),
                                              cuda_stream(in.device())));
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace

Tensor gelu(const Tensor& x) {
  const detail::LowPrecision lp("gelu", {{"x", x}});  // See Note [Low-precision compute]
  if (lp && cuda_bf16_path(x)) return gelu_cuda_bf16(x);
  if (lp) return lp.round(gelu(lp.f32(x)));
  detail::check_f32("gelu", "x", x);
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());
  if (in.device().is_cpu()) {
    kernels::cpu::gelu_forward(in.data<float>(), out.data<float>(), in.numel());
  } else {
    LOOM_IF_CUDA(kernels::cuda::gelu_forward(in.data<float>(), out.data<float>(), in.numel(),
                                             cuda_stream(in.device())));
  }
  autograd::record(out, "gelu", {x}, {in},
                   [in](const Tensor& g) { return std::vector<Tensor>{gelu_backward(in, g)}; });
  return out;
}

}  // namespace loom
