// binary_cross_entropy_with_logits: the mean over elements of the numerically stable form in
// kernels/cpu/binary_cross_entropy.h. Saves the logits and targets; the backward writes the
// logits' gradient (sigmoid(x) - y) / n directly, and the targets' -x / n only when they need one.
#include "kernels/cpu/binary_cross_entropy.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/binary_cross_entropy.h"
#endif

namespace loom {

namespace {

constexpr const char* kOp = "binary_cross_entropy_with_logits";

// Targets are probabilities: a value outside [0, 1] (or NaN) is a caller's mistake (labels of
// -1/+1, class ids) that would otherwise give a finite but meaningless loss.
void check_target_values(const Tensor& targets) {
  const float* y = targets.data<float>();
  for (int64_t i = 0; i < targets.numel(); ++i)
    LOOM_CHECK(y[i] >= 0.0f && y[i] <= 1.0f, kOp,
               ": argument 'targets' must hold probabilities in [0, 1], got ", y[i],
               " at flat index ", i);
}

// The CUDA path: the loss sum, the mean loss and the gradient's scale stay in device slots, so the
// host never waits for the GPU for them. The one exception is the targets' range check: like the
// CPU op (and as cross_entropy does with its class ids) it reads the targets on the host, one copy
// of [n] floats, so that bad targets are the same clear error on both devices.
Tensor binary_cross_entropy_cuda(const Tensor& logits, const Tensor& targets, const Tensor& x,
                                 const Tensor& y) {
#if LOOM_WITH_CUDA
  check_target_values(y.to(Device::cpu()));
  const Device device = x.device();
  const int64_t n = x.numel();
  const size_t workspace_bytes = kernels::cuda::binary_cross_entropy_workspace_bytes(n);
  Tensor workspace = cuda_workspace(device, workspace_bytes);
  Tensor sum = cuda_workspace(device, sizeof(double));
  Tensor out = Tensor::empty(Shape{}, DType::kF32, device);
  kernels::cuda::binary_cross_entropy_forward(
      x.data<float>(), y.data<float>(), n, static_cast<double*>(sum.data_ptr()),
      workspace.data_ptr(), workspace_bytes, cuda_stream(device));
  // No elements: loss 0 rather than 0/0 = NaN, as on the CPU.
  kernels::cuda::binary_cross_entropy_mean(static_cast<const double*>(sum.data_ptr()), n,
                                           out.data<float>(), cuda_stream(device));
  const bool targets_need_grad = targets.requires_grad();
  autograd::record(
      out, kOp, {logits, targets}, {x, y}, [x, y, n, targets_need_grad](const Tensor& g) {
        const Device device = x.device();
        Tensor gc = g.contiguous();
        Tensor scale = Tensor::empty({1}, DType::kF32, device);
        kernels::cuda::binary_cross_entropy_grad_scale(gc.data<float>(), n, scale.data<float>(),
                                                       cuda_stream(device));
        Tensor dx = Tensor::empty(x.shape(), DType::kF32, device);
        Tensor dy = targets_need_grad ? Tensor::empty(y.shape(), DType::kF32, device) : Tensor();
        kernels::cuda::binary_cross_entropy_backward(
            x.data<float>(), y.data<float>(), static_cast<const float*>(scale.data<float>()),
            dx.data<float>(), dy.defined() ? dy.data<float>() : nullptr, n, cuda_stream(device));
        return std::vector<Tensor>{dx, dy};
      });
  return out;
#else
  (void)logits, (void)targets, (void)x, (void)y;
  LOOM_FAIL(kOp, ": loom was built without CUDA");
#endif
}

}  // namespace

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets) {
  // bf16/f16: computed on f32 copies and, like cross_entropy, the loss stays f32; gradients come
  // back in the inputs' dtypes through the upcasts. See Note [Low-precision compute].
  const detail::LowPrecision lp(kOp, {{"logits", logits}, {"targets", targets}});
  if (lp) return binary_cross_entropy_with_logits(lp.f32(logits), lp.f32(targets));
  detail::check_f32(kOp, "logits", logits);
  detail::check_f32(kOp, "targets", targets);
  LOOM_CHECK(targets.shape() == logits.shape(), kOp, ": argument 'targets' must have the shape of ",
             "'logits' ", shape_str(logits.shape()), ", got ", shape_str(targets.shape()),
             "; reshape [B] labels to the logits' [B, 1] (or the logits to [B]) first");
  detail::check_same_device(kOp, "logits", logits, "targets", targets);

  Tensor x = logits.detach().contiguous(), y = targets.detach().contiguous();  // same shape
  if (x.device().is_cuda()) return binary_cross_entropy_cuda(logits, targets, x, y);
  check_target_values(y);
  const int64_t n = x.numel();
  // No elements: loss 0 and zero gradients rather than 0/0 = NaN, as cross_entropy does.
  const double total =
      kernels::cpu::binary_cross_entropy_forward(x.data<float>(), y.data<float>(), n);
  Tensor out = Tensor::scalar(n > 0 ? total / double(n) : 0.0, DType::kF32, x.device());
  const bool targets_need_grad = targets.requires_grad();
  autograd::record(
      out, kOp, {logits, targets}, {x, y}, [x, y, n, targets_need_grad](const Tensor& g) {
        const float scale = n > 0 ? float(g.item() / double(n)) : 0.0f;
        Tensor dx = Tensor::empty(x.shape(), DType::kF32, x.device());
        Tensor dy =
            targets_need_grad ? Tensor::empty(y.shape(), DType::kF32, y.device()) : Tensor();
        kernels::cpu::binary_cross_entropy_backward(x.data<float>(), y.data<float>(), scale,
                                                    dx.data<float>(),
                                                    dy.defined() ? dy.data<float>() : nullptr, n);
        return std::vector<Tensor>{dx, dy};
      });
  return out;
}

}  // namespace loom
