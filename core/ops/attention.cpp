// scaled_dot_product_attention on [B, H, T, D]. Saves q, k, v, the output and the per-row
// log-sum-exp; see kernels/cpu/attention.h for why not the probabilities.
#include "kernels/cpu/attention.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/attention.h"
#endif

namespace loom {

namespace {

// Attention on bf16 CUDA q, k, v through the kernels' bf16 overloads (Note [bf16 kernels on
// CUDA]): f32 arithmetic, bf16 storage. The exception that Note names is here: the backward reads
// the bf16 output the forward stored (as FlashAttention does), not an unrounded f32 one, so its
// gradients may differ from the f32 path's by rounding; saving the bf16 output is what keeps the
// activation memory at half.
Tensor attention_cuda_bf16(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const int64_t bh = q.size(0) * q.size(1), t = q.size(2), d = q.size(3);
  Tensor qc = q.detach().contiguous(), kc = k.detach().contiguous(), vc = v.detach().contiguous();
  const Device device = q.device();
  Tensor out = Tensor::empty(q.shape(), DType::kBF16, device);
  Tensor lse = Tensor::empty({q.size(0), q.size(1), t}, DType::kF32, device);
  LOOM_IF_CUDA(kernels::cuda::attention_forward(
      qc.data<BFloat16>(), kc.data<BFloat16>(), vc.data<BFloat16>(), out.data<BFloat16>(),
      lse.data<float>(), bh, t, d, causal, cuda_stream(device)));
  Tensor o = out.detach();
  autograd::record(
      out, "scaled_dot_product_attention", {q, k, v}, {qc, kc, vc, o, lse},
      [qc, kc, vc, o, lse, bh, t, d, causal](const Tensor& grad) {
        const Device device = qc.device();
        Tensor g = grad.to(DType::kBF16).contiguous();
        Tensor dq = Tensor::empty(qc.shape(), DType::kBF16, device);
        Tensor dk = Tensor::empty(qc.shape(), DType::kBF16, device);
        Tensor dv = Tensor::empty(qc.shape(), DType::kBF16, device);
        LOOM_IF_CUDA({
          const size_t bytes = kernels::cuda::attention_backward_workspace_bytes(bh, t, d);
          Tensor ws = cuda_workspace(device, bytes);
          kernels::cuda::attention_backward(
              qc.data<BFloat16>(), kc.data<BFloat16>(), vc.data<BFloat16>(), o.data<BFloat16>(),
              lse.data<float>(), g.data<BFloat16>(), dq.data<BFloat16>(), dk.data<BFloat16>(),
              dv.data<BFloat16>(), bh, t, d, causal, ws.data_ptr(), bytes, cuda_stream(device));
        });
        return std::vector<Tensor>{dq, dk, dv};
      });
  return out;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal) {
  constexpr const char* op = "scaled_dot_product_attention";
  // See Note [Low-precision compute].
  const detail::LowPrecision lp(op, {{"q", q}, {"k", k}, {"v", v}});
  const bool bf16 = lp && cuda_bf16_path(q, {&k, &v}) && k.dtype() == DType::kBF16 &&
                    v.dtype() == DType::kBF16;  // Note [bf16 kernels on CUDA]
  if (bf16) {
    detail::check_dim(op, "q", q, 4);
    LOOM_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), op, ": k ", shape_str(k.shape()),
               " and v ", shape_str(v.shape()), " must have q's shape ", shape_str(q.shape()),
               " [B, H, T, D]");
    return attention_cuda_bf16(q, k, v, causal);
  }
  if (lp) return lp.round(scaled_dot_product_attention(lp.f32(q), lp.f32(k), lp.f32(v), causal));
  detail::check_f32(op, "q", q);
  detail::check_f32(op, "k", k);
  detail::check_f32(op, "v", v);
  detail::check_dim(op, "q", q, 4);
  LOOM_CHECK(k.shape() == q.shape(), op, ": argument 'k' has shape ", shape_str(k.shape()),
             ", expected q's shape ", shape_str(q.shape()), " [B, H, T, D]");
  LOOM_CHECK(v.shape() == q.shape(), op, ": argument 'v' has shape ", shape_str(v.shape()),
             ", expected q's shape ", shape_str(q.shape()), " [B, H, T, D]");
  detail::check_same_device(op, "q", q, "k", k);
  detail::check_same_device(op, "q", q, "v", v);
  const int64_t bh = q.size(0) * q.size(1), t = q.size(2), d = q.size(3);
  Tensor qc = q.detach().contiguous(), kc = k.detach().contiguous(), vc = v.detach().contiguous();
  Tensor out = Tensor::empty(q.shape(), DType::kF32, q.device());
  Tensor lse = Tensor::empty({q.size(0), q.size(1), t}, DType::kF32, q.device());
  if (q.device().is_cpu()) {
    kernels::cpu::attention_forward(qc.data<float>(), kc.data<float>(), vc.data<float>(),
                                    out.data<float>(), lse.data<float>(), bh, t, d, causal);
  } else {
    LOOM_IF_CUDA(kernels::cuda::attention_forward(
        qc.data<float>(), kc.data<float>(), vc.data<float>(), out.data<float>(), lse.data<float>(),
        bh, t, d, causal, cuda_stream(q.device())));
  }
  Tensor o = out.detach();
  autograd::record(
      out, op, {q, k, v}, {qc, kc, vc, o, lse},
      [qc, kc, vc, o, lse, bh, t, d, causal](const Tensor& g) {
        Tensor gc = g.contiguous();
        Tensor dq = Tensor::empty(qc.shape(), DType::kF32, qc.device());
        Tensor dk = Tensor::empty(qc.shape(), DType::kF32, qc.device());
        Tensor dv = Tensor::empty(qc.shape(), DType::kF32, qc.device());
        if (qc.device().is_cpu()) {
          kernels::cpu::attention_backward(qc.data<float>(), kc.data<float>(), vc.data<float>(),
                                           o.data<float>(), lse.data<float>(), gc.data<float>(),
                                           dq.data<float>(), dk.data<float>(), dv.data<float>(), bh,
                                           t, d, causal);
        } else {
          LOOM_IF_CUDA({
            const size_t bytes = kernels::cuda::attention_backward_workspace_bytes(bh, t, d);
            Tensor ws = cuda_workspace(qc.device(), bytes);
            kernels::cuda::attention_backward(
                qc.data<float>(), kc.data<float>(), vc.data<float>(), o.data<float>(),
                lse.data<float>(), gc.data<float>(), dq.data<float>(), dk.data<float>(),
                dv.data<float>(), bh, t, d, causal, ws.data_ptr(), bytes, cuda_stream(qc.device()));
          });
        }
        return std::vector<Tensor>{dq, dk, dv};
      });
  return out;
}

}  // namespace loom
