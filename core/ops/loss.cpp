// cross_entropy: fused log-softmax + negative log-likelihood, mean over non-ignored rows. Saves
// the logits and one log-sum-exp per row; the backward writes the logits' gradient directly.
#include <type_traits>

#include "core/cuda_dispatch.h"
#include "core/dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#include "kernels/cpu/cross_entropy.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/cross_entropy.h"
#endif

namespace loom {

namespace {

template <typename I>
void check_targets(const I* targets, int64_t rows, int64_t classes, int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = int64_t(targets[r]);
    LOOM_CHECK(t == ignore_index || (t >= 0 && t < classes), "cross_entropy: target ", t,
               " at row ", r, " is outside [0, ", classes, ") and is not ignore_index (",
               ignore_index, ")");
  }
}

// The CUDA path: the loss, its row count and the gradient's scale stay in device slots, so the
// host never waits for the GPU (the targets' range check copies them to the host first, as a
// device-side check does not exist yet). Logits are f32, or bf16 read directly by the kernels
// (Note [bf16 kernels on CUDA]); the loss is f32 and the logits' gradient takes their dtype.
Tensor cross_entropy_cuda(const Tensor& logits, const Tensor& x, const Tensor& tg,
                          const kernels::cpu::CrossEntropyShape& shape) {
#if LOOM_WITH_CUDA
  const Tensor host_targets = tg.to(Device::cpu());
  const Device device = x.device();
  Tensor lse = Tensor::empty({shape.rows}, DType::kF32, device);
  Tensor sum = cuda_workspace(device, sizeof(double));
  Tensor count = Tensor::empty({1}, DType::kI64, device);
  Tensor out = Tensor::empty(Shape{}, DType::kF32, device);
  // Calls f(value tag, index tag) for the logits' and the targets' element types.
  auto with_types = [](const Tensor& logits, const Tensor& targets, auto&& f) {
    visit_index_dtype(targets.dtype(), [&](auto index_tag) {
      if (logits.dtype() == DType::kBF16)
        f(BFloat16{}, index_tag);
      else
        f(float{}, index_tag);
    });
  };
  with_types(x, tg, [&](auto value_tag, auto index_tag) {
    using T = decltype(value_tag);
    using I = decltype(index_tag);
    check_targets(host_targets.data<I>(), shape.rows, shape.num_classes, shape.ignore_index);
    kernels::cuda::cross_entropy_forward(x.data<T>(), tg.data<I>(), lse.data<float>(), shape,
                                         static_cast<double*>(sum.data_ptr()),
                                         count.data<int64_t>(), cuda_stream(device));
  });
  kernels::cuda::cross_entropy_mean(static_cast<const double*>(sum.data_ptr()),
                                    count.data<int64_t>(), out.data<float>(), cuda_stream(device));
  autograd::record(
      out, "cross_entropy", {logits}, {x, tg, lse, count},
      [x, tg, lse, shape, count, with_types](const Tensor& g) {
        const Device device = x.device();
        Tensor gc = g.to(DType::kF32).contiguous();
        Tensor scale = Tensor::empty({1}, DType::kF32, device);
        kernels::cuda::cross_entropy_grad_scale(gc.data<float>(), count.data<int64_t>(),
                                                scale.data<float>(), cuda_stream(device));
        Tensor dx = Tensor::empty(x.shape(), x.dtype(), device);
        with_types(x, tg, [&](auto value_tag, auto index_tag) {
          using T = decltype(value_tag);
          using I = decltype(index_tag);
          kernels::cuda::cross_entropy_backward(x.data<T>(), tg.data<I>(), lse.data<float>(),
                                                scale.data<float>(), dx.data<T>(), shape,
                                                cuda_stream(device));
        });
        return std::vector<Tensor>{dx};
      });
  return out;
#else
  (void)logits, (void)x, (void)tg, (void)shape;
  LOOM_FAIL("cross_entropy: loom was built without CUDA");
#endif
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options) {
  // bf16/f16 logits: computed on an f32 copy and, unlike other ops, the loss stays f32 (as under
  // PyTorch autocast); the logits' gradient comes back in their dtype through the upcast. See
  // Note [Low-precision compute].
  const detail::LowPrecision lp("cross_entropy", {{"logits", logits}});
  const bool bf16 = lp && cuda_bf16_path(logits);  // Note [bf16 kernels on CUDA]
  if (lp && !bf16) return cross_entropy(lp.f32(logits), targets, options);
  if (!bf16) detail::check_f32("cross_entropy", "logits", logits);
  detail::check_dim("cross_entropy", "logits", logits, 2);
  detail::check_index("cross_entropy", "targets", targets);
  LOOM_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0),
             "cross_entropy: argument 'targets' must have shape [", logits.size(0),
             "] (one per row of logits ", shape_str(logits.shape()), "), got ",
             shape_str(targets.shape()), "; flatten [B, T, V] logits to [B*T, V] first");
  detail::check_same_device("cross_entropy", "logits", logits, "targets", targets);
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const int64_t classes = options.num_classes < 0 ? cols : options.num_classes;
  LOOM_CHECK(classes >= 1 && classes <= cols, "cross_entropy: num_classes ", options.num_classes,
             " must be in [1, ", cols, "] (the logits' last dim), or -1 for all columns");

  Tensor x = logits.detach().contiguous(), tg = targets.detach().contiguous();
  const kernels::cpu::CrossEntropyShape shape{rows, cols, classes, options.ignore_index};
  if (x.device().is_cuda()) return cross_entropy_cuda(logits, x, tg, shape);
  Tensor lse = Tensor::empty({rows}, DType::kF32, x.device());
  int64_t count = 0;
  double total = 0.0;
  visit_index_dtype(tg.dtype(), [&](auto tag) {
    using I = decltype(tag);
    check_targets(tg.data<I>(), rows, classes, options.ignore_index);
    total = kernels::cpu::cross_entropy_forward(x.data<float>(), tg.data<I>(), lse.data<float>(),
                                                shape, &count);
  });
  // All rows ignored: loss 0 and zero gradients rather than PyTorch's 0/0 = NaN, so a micro-batch
  // that is all padding does not poison the step.
  Tensor out = Tensor::scalar(count > 0 ? total / double(count) : 0.0, DType::kF32, x.device());
  autograd::record(
      out, "cross_entropy", {logits}, {x, tg, lse}, [x, tg, lse, shape, count](const Tensor& g) {
        const float scale = count > 0 ? float(g.item() / double(count)) : 0.0f;
        Tensor dx = Tensor::empty(x.shape(), DType::kF32, x.device());
        visit_index_dtype(tg.dtype(), [&](auto tag) {
          using I = decltype(tag);
          kernels::cpu::cross_entropy_backward(x.data<float>(), tg.data<I>(), lse.data<float>(),
                                               scale, dx.data<float>(), shape);
        });
        return std::vector<Tensor>{dx};
      });
  return out;
}

}  // namespace loom
