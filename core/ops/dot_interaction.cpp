// dot_interaction: DLRM's pairwise dot products of feature vectors, the strictly lower triangle of
// x_b x_b^T per sample (order and the choice of a dedicated kernel over matmul + gather: see
// kernels/cpu/dot_interaction.h). Saves only the input.
#include "kernels/cpu/dot_interaction.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/dot_interaction.h"
#endif

namespace loom {

Tensor dot_interaction(const Tensor& features) {
  const detail::LowPrecision lp("dot_interaction", {{"features", features}});
  if (lp) return lp.round(dot_interaction(lp.f32(features)));  // See Note [Low-precision compute]
  detail::check_f32("dot_interaction", "features", features);
  LOOM_CHECK(features.dim() == 3, "dot_interaction: argument 'features' must be 3-D [B, F, D] ",
             "(F feature vectors of dim D per sample), got shape ", shape_str(features.shape()));
  Tensor x = features.detach().contiguous();  // [B, F, D]
  const int64_t batch = x.size(0), num = x.size(1), dim = x.size(2);
  Tensor out = Tensor::empty({batch, num * (num - 1) / 2}, DType::kF32, x.device());  // [B, P]
  if (x.device().is_cpu()) {
    kernels::cpu::dot_interaction_forward(x.data<float>(), out.data<float>(), batch, num, dim);
  } else {
    LOOM_IF_CUDA(kernels::cuda::dot_interaction_forward(x.data<float>(), out.data<float>(), batch,
                                                        num, dim, cuda_stream(x.device())));
  }
  autograd::record(out, "dot_interaction", {features}, {x}, [x](const Tensor& grad) {
    Tensor g = grad.contiguous();                                   // [B, P]
    Tensor dx = Tensor::empty(x.shape(), DType::kF32, x.device());  // [B, F, D]
    if (x.device().is_cpu()) {
      kernels::cpu::dot_interaction_backward(x.data<float>(), g.data<float>(), dx.data<float>(),
                                             x.size(0), x.size(1), x.size(2));
    } else {
      LOOM_IF_CUDA(kernels::cuda::dot_interaction_backward(x.data<float>(), g.data<float>(),
                                                           dx.data<float>(), x.size(0), x.size(1),
                                                           x.size(2), cuda_stream(x.device())));
    }
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom
