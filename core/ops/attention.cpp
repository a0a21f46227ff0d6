// scaled_dot_product_attention on [B, H, T, D]. Saves q, k, v, the output and the per-row
// log-sum-exp; see kernels/cpu/attention.h for why not the probabilities.
#include "kernels/cpu/attention.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_gemm.h"
#endif

#include <cstdlib>
#include <string>

namespace loom {

namespace {

// Note [CUDA attention kernels]
// CUDA has two attention implementations with the same contract: the flash kernels
// (kernels/cuda/attention.h: O(T) memory, CUDA-core products) and GEMM attention
// (kernels/cuda/attention_gemm.h: the scores of a group of heads in a workspace, every product a
// cuBLAS GEMM; 3-4x faster at GPT-2's shape on an H100, see benchmarks/README.md). GEMM attention
// is taken when one pass of at least one head fits in kGemmAttentionMaxBytes of workspace (a
// backward pass of GPT-2 124M's 96 heads of T 1024 in bf16 takes 936 MiB, so it runs in one);
// longer sequences use the flash kernels. The workspace comes from the caching allocator for the
// duration of the call only. LOOM_CUDA_ATTENTION=flash (or gemm) forces one implementation, for
// a GPU short of memory or a comparison; a forced gemm still keeps to the cap, down to one head
// per pass. Both give the CPU's results to f32 rounding; they are not bit-identical to each other.
constexpr size_t kGemmAttentionMaxBytes = size_t(1) << 30;

struct CudaAttentionPlan {
  bool gemm = false;
  size_t forward_bytes = 0, backward_bytes = 0;  // GEMM attention's workspaces
};

CudaAttentionPlan plan_cuda_attention(int64_t bh, int64_t t, int64_t d, bool bf16) {
  CudaAttentionPlan plan;
  const char* env = std::getenv("LOOM_CUDA_ATTENTION");
  const std::string choice = env ? env : "auto";
  LOOM_CHECK(choice == "auto" || choice == "gemm" || choice == "flash", "LOOM_CUDA_ATTENTION='",
             choice, "' is not one of auto, gemm, flash");
  if (choice == "flash" || bh == 0 || t == 0) return plan;
#if LOOM_WITH_CUDA
  namespace kc = kernels::cuda;
  const int64_t heads =
      kc::attention_gemm_heads_per_pass(bh, t, d, bf16, /*backward=*/true, kGemmAttentionMaxBytes);
  if (heads == 0 && choice == "auto") return plan;
  const int64_t per_pass = heads > 0 ? heads : 1;
  plan.gemm = true;
  plan.forward_bytes = kc::attention_gemm_workspace_bytes(per_pass, t, d, bf16, false);
  plan.backward_bytes = kc::attention_gemm_workspace_bytes(per_pass, t, d, bf16, true);
#else
  (void)d;
  (void)bf16;
#endif
  return plan;
}

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
  const CudaAttentionPlan plan = plan_cuda_attention(bh, t, d, /*bf16=*/true);
  LOOM_IF_CUDA({
    if (plan.gemm) {
      Tensor ws = cuda_workspace(device, plan.forward_bytes);
      kernels::cuda::attention_gemm_forward(qc.data<BFloat16>(), kc.data<BFloat16>(),
                                            vc.data<BFloat16>(), out.data<BFloat16>(),
                                            lse.data<float>(), bh, t, d, causal, ws.data_ptr(),
                                            plan.forward_bytes, cuda_stream(device));
    } else {
      kernels::cuda::attention_forward(qc.data<BFloat16>(), kc.data<BFloat16>(),
                                       vc.data<BFloat16>(), out.data<BFloat16>(), lse.data<float>(),
                                       bh, t, d, causal, cuda_stream(device));
    }
  });
  Tensor o = out.detach();
  autograd::record(
      out, "scaled_dot_product_attention", {q, k, v}, {qc, kc, vc, o, lse},
      [qc, kc, vc, o, lse, bh, t, d, causal, plan](const Tensor& grad) {
        const Device device = qc.device();
        Tensor g = grad.to(DType::kBF16).contiguous();
        Tensor dq = Tensor::empty(qc.shape(), DType::kBF16, device);
        Tensor dk = Tensor::empty(qc.shape(), DType::kBF16, device);
        Tensor dv = Tensor::empty(qc.shape(), DType::kBF16, device);
        LOOM_IF_CUDA({
          if (plan.gemm) {
            Tensor ws = cuda_workspace(device, plan.backward_bytes);
            kernels::cuda::attention_gemm_backward(
                qc.data<BFloat16>(), kc.data<BFloat16>(), vc.data<BFloat16>(), o.data<BFloat16>(),
                lse.data<float>(), g.data<BFloat16>(), dq.data<BFloat16>(), dk.data<BFloat16>(),
                dv.data<BFloat16>(), bh, t, d, causal, ws.data_ptr(), plan.backward_bytes,
                cuda_stream(device));
            return std::vector<Tensor>{dq, dk, dv};
          }
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
  const CudaAttentionPlan plan =
      q.device().is_cpu() ? CudaAttentionPlan{} : plan_cuda_attention(bh, t, d, /*bf16=*/false);
  if (q.device().is_cpu()) {
    kernels::cpu::attention_forward(qc.data<float>(), kc.data<float>(), vc.data<float>(),
                                    out.data<float>(), lse.data<float>(), bh, t, d, causal);
  } else if (plan.gemm) {
    LOOM_IF_CUDA({
      Tensor ws = cuda_workspace(q.device(), plan.forward_bytes);
      kernels::cuda::attention_gemm_forward(qc.data<float>(), kc.data<float>(), vc.data<float>(),
                                            out.data<float>(), lse.data<float>(), bh, t, d, causal,
                                            ws.data_ptr(), plan.forward_bytes,
                                            cuda_stream(q.device()));
    });
  } else {
    LOOM_IF_CUDA(kernels::cuda::attention_forward(
        qc.data<float>(), kc.data<float>(), vc.data<float>(), out.data<float>(), lse.data<float>(),
        bh, t, d, causal, cuda_stream(q.device())));
  }
  Tensor o = out.detach();
  autograd::record(
      out, op, {q, k, v}, {qc, kc, vc, o, lse},
      [qc, kc, vc, o, lse, bh, t, d, causal, plan](const Tensor& g) {
        Tensor gc = g.contiguous();
        Tensor dq = Tensor::empty(qc.shape(), DType::kF32, qc.device());
        Tensor dk = Tensor::empty(qc.shape(), DType::kF32, qc.device());
        Tensor dv = Tensor::empty(qc.shape(), DType::kF32, qc.device());
        if (qc.device().is_cpu()) {
          kernels::cpu::attention_backward(qc.data<float>(), kc.data<float>(), vc.data<float>(),
                                           o.data<float>(), lse.data<float>(), gc.data<float>(),
                                           dq.data<float>(), dk.data<float>(), dv.data<float>(), bh,
                                           t, d, causal);
        } else if (plan.gemm) {
          LOOM_IF_CUDA({
            Tensor ws = cuda_workspace(qc.device(), plan.backward_bytes);
            kernels::cuda::attention_gemm_backward(
                qc.data<float>(), kc.data<float>(), vc.data<float>(), o.data<float>(),
                lse.data<float>(), gc.data<float>(), dq.data<float>(), dk.data<float>(),
                dv.data<float>(), bh, t, d, causal, ws.data_ptr(), plan.backward_bytes,
                cuda_stream(qc.device()));
          });
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
