// softmax over the last dim. The backward saves the output, not the input: the gradient is a
// function of y alone.
#include "kernels/cpu/softmax.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/softmax.h"
#endif

namespace loom {

Tensor softmax(const Tensor& x) {
  const detail::LowPrecision lp("softmax", {{"x", x}});  // See Note [Low-precision compute]
  if (lp) return lp.round(softmax(lp.f32(x)));
  detail::check_f32("softmax", "x", x);
  LOOM_CHECK(x.dim() >= 1, "softmax: argument 'x' must have at least 1 dim, got shape ",
             shape_str(x.shape()));
  Tensor in = x.contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());
  const int64_t cols = in.size(-1), rows = cols > 0 ? in.numel() / cols : 0;
  if (in.device().is_cpu()) {
    kernels::cpu::softmax_forward(in.data<float>(), out.data<float>(), rows, cols);
  } else {
    LOOM_IF_CUDA(kernels::cuda::softmax_forward(in.data<float>(), out.data<float>(), rows, cols,
                                                cuda_stream(in.device())));
  }
  Tensor y = out.detach();
  autograd::record(out, "softmax", {x}, {y}, [y, rows, cols](const Tensor& g) {
    Tensor gc = g.contiguous();
    Tensor dx = Tensor::empty(y.shape(), DType::kF32, y.device());
    if (y.device().is_cpu()) {
      kernels::cpu::softmax_backward(y.data<float>(), gc.data<float>(), dx.data<float>(), rows,
                                     cols);
    } else {
      LOOM_IF_CUDA(kernels::cuda::softmax_backward(y.data<float>(), gc.data<float>(),
                                                   dx.data<float>(), rows, cols,
                                                   cuda_stream(y.device())));
    }
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom
