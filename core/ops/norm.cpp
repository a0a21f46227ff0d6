// layer_norm over the last dim. The forward keeps per-row mean and rstd (two floats per row) for
// the backward instead of the normalised activations.
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#include "kernels/cpu/layer_norm.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/layer_norm.h"
#endif

namespace loom {

namespace {

void check_param(const char* arg, const Tensor& p, const Tensor& x, int64_t cols) {
  if (!p.defined()) return;
  detail::check_f32("layer_norm", arg, p);
  detail::check_same_device("layer_norm", "x", x, arg, p);
  LOOM_CHECK(p.shape() == Shape{cols}, "layer_norm: argument '", arg, "' must have shape [", cols,
             "] (the last dim of x ", shape_str(x.shape()), "), got ", shape_str(p.shape()));
}

const float* data_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

// layer_norm on a bf16 CUDA x through the kernels' bf16 overloads (Note [bf16 kernels on CUDA]):
// weight and bias (bf16 or f32) go to the kernel as f32 copies, and their gradients, computed in
// f32, come back rounded to their own dtypes.
Tensor layer_norm_cuda_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  LOOM_CHECK(x.dim() >= 1, "layer_norm: argument 'x' must have at least 1 dim, got shape ",
             shape_str(x.shape()));
  const int64_t cols = x.size(-1), rows = cols > 0 ? x.numel() / cols : 0;
  auto f32_param = [&](const char* arg, const Tensor& p) {
    if (!p.defined()) return Tensor();
    LOOM_CHECK(p.shape() == Shape{cols}, "layer_norm: argument '", arg, "' must have shape [", cols,
               "] (the last dim of x ", shape_str(x.shape()), "), got ", shape_str(p.shape()));
    return p.detach().to(DType::kF32).contiguous();
  };
  LOOM_CHECK(eps >= 0.0, "layer_norm: eps must be >= 0, got ", eps);
  Tensor in = x.detach().contiguous();
  Tensor w = f32_param("weight", weight), b = f32_param("bias", bias);
  const Device device = in.device();
  Tensor out = Tensor::empty(in.shape(), DType::kBF16, device);
  Tensor mean = Tensor::empty({rows}, DType::kF32, device);
  Tensor rstd = Tensor::empty({rows}, DType::kF32, device);
  LOOM_IF_CUDA(kernels::cuda::layer_norm_forward(
      in.data<BFloat16>(), data_or_null(w), data_or_null(b), out.data<BFloat16>(),
      mean.data<float>(), rstd.data<float>(), rows, cols, float(eps), cuda_stream(device)));
  const bool need_dx = x.requires_grad();
  const bool need_dw = weight.defined() && weight.requires_grad();
  const bool need_db = bias.defined() && bias.requires_grad();
  const DType w_dtype = weight.defined() ? weight.dtype() : DType::kF32;
  const DType b_dtype = bias.defined() ? bias.dtype() : DType::kF32;
  autograd::record(
      out, "layer_norm", {x, weight, bias}, {in, w, mean, rstd},
      [in, w, mean, rstd, rows, cols, need_dx, need_dw, need_db, w_dtype,
       b_dtype](const Tensor& grad) {
        const Device device = in.device();
        Tensor g = grad.to(DType::kBF16).contiguous();
        Tensor dx = need_dx ? Tensor::empty(in.shape(), DType::kBF16, device) : Tensor();
        Tensor dw = need_dw ? Tensor::empty({cols}, DType::kF32, device) : Tensor();
        Tensor db = need_db ? Tensor::empty({cols}, DType::kF32, device) : Tensor();
        LOOM_IF_CUDA({
          const size_t bytes = kernels::cuda::layer_norm_backward_workspace_bytes(rows, cols);
          Tensor ws = cuda_workspace(device, bytes);
          kernels::cuda::layer_norm_backward(
              in.data<BFloat16>(), data_or_null(w), mean.data<float>(), rstd.data<float>(),
              g.data<BFloat16>(), dx.defined() ? dx.data<BFloat16>() : nullptr,
              dw.defined() ? dw.data<float>() : nullptr, db.defined() ? db.data<float>() : nullptr,
              rows, cols, ws.data_ptr(), bytes, cuda_stream(device));
        });
        if (dw.defined() && w_dtype != DType::kF32) dw = dw.to(w_dtype);
        if (db.defined() && b_dtype != DType::kF32) db = db.to(b_dtype);
        return std::vector<Tensor>{dx, dw, db};
      });
  return out;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  // See Note [Low-precision compute]; undefined weight or bias stay undefined.
  const detail::LowPrecision lp("layer_norm", {{"x", x}, {"weight", weight}, {"bias", bias}});
  if (lp && cuda_bf16_path(x, {&weight, &bias})) return layer_norm_cuda_bf16(x, weight, bias, eps);
  if (lp) return lp.round(layer_norm(lp.f32(x), lp.f32(weight), lp.f32(bias), eps));
  detail::check_f32("layer_norm", "x", x);
  LOOM_CHECK(x.dim() >= 1, "layer_norm: argument 'x' must have at least 1 dim, got shape ",
             shape_str(x.shape()));
  const int64_t cols = x.size(-1), rows = cols > 0 ? x.numel() / cols : 0;
  check_param("weight", weight, x, cols);
  check_param("bias", bias, x, cols);
  LOOM_CHECK(eps >= 0.0, "layer_norm: eps must be >= 0, got ", eps);
  Tensor in = x.detach().contiguous();
  Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());
  Tensor mean = Tensor::empty({rows}, DType::kF32, in.device());
  Tensor rstd = Tensor::empty({rows}, DType::kF32, in.device());
  if (in.device().is_cpu()) {
    kernels::cpu::layer_norm_forward(in.data<float>(), data_or_null(w), data_or_null(b),
                                     out.data<float>(), mean.data<float>(), rstd.data<float>(),
                                     rows, cols, float(eps));
  } else {
    LOOM_IF_CUDA(kernels::cuda::layer_norm_forward(
        in.data<float>(), data_or_null(w), data_or_null(b), out.data<float>(), mean.data<float>(),
        rstd.data<float>(), rows, cols, float(eps), cuda_stream(in.device())));
  }
  const bool need_dx = x.requires_grad();
  const bool need_dw = weight.defined() && weight.requires_grad();
  const bool need_db = bias.defined() && bias.requires_grad();
  autograd::record(
      out, "layer_norm", {x, weight, bias}, {in, w, mean, rstd},
      [in, w, mean, rstd, rows, cols, need_dx, need_dw, need_db](const Tensor& g) {
        Tensor gc = g.contiguous();
        Tensor dx = need_dx ? Tensor::empty(in.shape(), DType::kF32, in.device()) : Tensor();
        Tensor dw = need_dw ? Tensor::empty({cols}, DType::kF32, in.device()) : Tensor();
        Tensor db = need_db ? Tensor::empty({cols}, DType::kF32, in.device()) : Tensor();
        float* dx_p = dx.defined() ? dx.data<float>() : nullptr;
        float* dw_p = dw.defined() ? dw.data<float>() : nullptr;
        float* db_p = db.defined() ? db.data<float>() : nullptr;
        if (in.device().is_cpu()) {
          kernels::cpu::layer_norm_backward(in.data<float>(), data_or_null(w), mean.data<float>(),
                                            rstd.data<float>(), gc.data<float>(), dx_p, dw_p, db_p,
                                            rows, cols);
        } else {
          LOOM_IF_CUDA({
            const size_t bytes = kernels::cuda::layer_norm_backward_workspace_bytes(rows, cols);
            Tensor ws = cuda_workspace(in.device(), bytes);
            kernels::cuda::layer_norm_backward(in.data<float>(), data_or_null(w),
                                               mean.data<float>(), rstd.data<float>(),
                                               gc.data<float>(), dx_p, dw_p, db_p, rows, cols,
                                               ws.data_ptr(), bytes, cuda_stream(in.device()));
          });
        }
        return std::vector<Tensor>{dx, dw, db};
      });
  return out;
}

}  // namespace loom
