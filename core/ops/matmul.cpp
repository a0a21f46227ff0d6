// matmul and linear. Both reduce to row-major GEMMs on contiguous operands with transpose flags
// (kernels/cpu/gemm.h, kernels/cuda/gemm.h); a transpose is a flag, never a copy.
//
// Note [GEMM operands]
// An operand is handed to the GEMM as (contiguous data, flag). A contiguous tensor goes as is; a
// tensor whose last two dims are a transposed view of contiguous memory (w.transpose(0, 1), the
// k^T of attention) goes as that memory with its flag flipped, so it is not copied either. Only
// other layouts are copied by contiguous(). Gradients are computed for the data as handed over
// and transposed back (a view) where the flag was flipped.
//
// A shared b (2-D) against a batched a is one GEMM over the flattened batch when a is not
// transposed ([B*M, K] x [K, N]); so is b's gradient, summed over the batch ([K, B*M] x [B*M, N]).
// Where a is transposed that flattening is impossible and the products are batched instead (b's
// gradient then sums the per-entry products in order, beta = 1).
//
// Note [bf16 GEMMs on CUDA]
// Every other op computes bf16 through f32 copies (Note [Low-precision compute]); matmul and
// linear on CUDA tensors that are all bf16 instead hand the bf16 data to cuBLAS (tensor cores,
// f32 accumulation, one rounding of each result to bf16), which is what makes bf16 training fast.
// The semantics are the same, the f32 result rounded once, up to the order of the f32
// accumulation inside the GEMM, so a result may differ from the f32 path's by one bf16 step.
// Gradients are bf16 GEMMs too; linear's bias is added in f32 by cuBLASLt's epilogue and its
// gradient summed in f32, then rounded to the bias's dtype.
#include <algorithm>

#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/reduce.h"

namespace loom {

namespace {

// See Note [GEMM operands].
struct Operand {
  Tensor data;   // contiguous, no autograd history (dropped once backward no longer needs it)
  bool trans;    // the GEMM flag for `data`
  bool flipped;  // data is the transpose of the caller's tensor
  Shape shape;   // data's shape, kept when data is dropped
};

Operand gemm_operand(const Tensor& t, bool trans) {
  Tensor d = t.detach();
  if (d.is_contiguous()) return {d, trans, false, d.shape()};
  if (d.dim() >= 2) {
    Shape shape = d.shape(), strides = d.strides();
    std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
    std::swap(strides[strides.size() - 1], strides[strides.size() - 2]);
    Tensor swapped = make_view(d, shape, strides, d.offset());
    if (swapped.is_contiguous()) return {swapped, !trans, true, shape};
  }
  return {d.contiguous(), trans, false, d.shape()};
}

// The gradient for the caller's tensor from the gradient for the operand's data.
Tensor unflip(const Tensor& grad_data, const Operand& op) {
  return op.flipped ? transpose(grad_data, -1, -2) : grad_data;
}

// out = op(A) op(B) on contiguous row-major data, for `batch` products whose A, B and out start
// stride_a/b/c elements apart (0 shares an operand). stride_c == 0 sums all products into out.
// `out` is a fresh contiguous tensor that receives the whole result.
void gemm(Tensor& out, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& a,
          int64_t stride_a, const Tensor& b, int64_t stride_b, int64_t stride_c, int64_t batch,
          float beta = 0.0f) {
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {  // empty products: nothing to add to a pre-filled out, zeros otherwise
    if (beta == 0.0f) out.zero_();
    return;
  }
  const int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
  const Device device = out.device();
  if (out.dtype() == DType::kBF16) {  // See Note [bf16 GEMMs on CUDA]
    LOOM_CHECK(device.is_cuda(), "matmul: bf16 GEMMs run on CUDA only");
    const BFloat16* qa = a.data<BFloat16>();
    const BFloat16* qb = b.data<BFloat16>();
    BFloat16* qc = out.data<BFloat16>();
    if (batch == 1 || stride_c == 0) {
      for (int64_t i = 0; i < batch; ++i)
        LOOM_IF_CUDA(kernels::cuda::gemm(ta, tb, m, n, k, 1.0f, qa + i * stride_a, lda,
                                         qb + i * stride_b, ldb, i == 0 ? beta : 1.0f, qc, ldc,
                                         cuda_stream(device)));
    } else {
      LOOM_IF_CUDA(kernels::cuda::gemm_strided_batched(ta, tb, m, n, k, 1.0f, qa, lda, stride_a, qb,
                                                       ldb, stride_b, beta, qc, ldc, stride_c,
                                                       batch, cuda_stream(device)));
    }
    return;
  }
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* pc = out.data<float>();
  if (batch == 1 || stride_c == 0) {
    for (int64_t i = 0; i < batch; ++i) {
      const float bi = i == 0 ? beta : 1.0f;
      if (device.is_cpu()) {
        kernels::cpu::gemm(ta, tb, m, n, k, 1.0f, pa + i * stride_a, lda, pb + i * stride_b, ldb,
                           bi, pc, ldc);
      } else {
        LOOM_IF_CUDA(kernels::cuda::gemm(ta, tb, m, n, k, 1.0f, pa + i * stride_a, lda,
                                         pb + i * stride_b, ldb, bi, pc, ldc, cuda_stream(device)));
      }
    }
    return;
  }
  if (device.is_cpu()) {
    kernels::cpu::gemm_strided_batched(ta, tb, m, n, k, 1.0f, pa, lda, stride_a, pb, ldb, stride_b,
                                       beta, pc, ldc, stride_c, batch);
  } else {
    LOOM_IF_CUDA(kernels::cuda::gemm_strided_batched(ta, tb, m, n, k, 1.0f, pa, lda, stride_a, pb,
                                                     ldb, stride_b, beta, pc, ldc, stride_c, batch,
                                                     cuda_stream(device)));
  }
}

// One product op(A) op(B) over `batch` entries of A; B is shared (2-D) or has A's batch.
struct Product {
  Operand a, b;
  int64_t batch, m, n, k;
  bool shared_b;
  DType dtype = DType::kF32;  // of the operands and the result: f32, or bf16 on CUDA
};

// True when matmul/linear take cuBLAS's bf16 path (See Note [bf16 GEMMs on CUDA]).
bool cuda_bf16(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.device().is_cuda() && a.dtype() == DType::kBF16 &&
         b.dtype() == DType::kBF16 && b.device() == a.device();
}

// Writes op(A) op(B) into `out` (contiguous, [batch * M, N] elements), adding to what out holds
// when beta == 1 (linear's bias, put there first).
void product_forward(const Product& p, Tensor& out, float beta) {
  const int64_t sa = p.m * p.k, sb = p.shared_b ? 0 : p.k * p.n, sc = p.m * p.n;
  if (p.shared_b && !p.a.trans)  // flatten the batch into the rows of one GEMM
    gemm(out, false, p.b.trans, p.batch * p.m, p.n, p.k, p.a.data, 0, p.b.data, 0, 0, 1, beta);
  else
    gemm(out, p.a.trans, p.b.trans, p.m, p.n, p.k, p.a.data, sa, p.b.data, sb, sc, p.batch, beta);
}

// Gradients for the operands' data (shapes a.shape and b.shape) from the output gradient g,
// contiguous [batch, M, N]. With C = op(A) op(B):
//   dA = g op(B)^T, or op(B) g^T when A is transposed;
//   dB = op(A)^T g, or g^T op(A) when B is transposed (summed over the batch when shared).
std::pair<Tensor, Tensor> product_backward(const Product& p, const Tensor& grad, bool need_a,
                                           bool need_b) {
  const Tensor g = grad.dtype() == p.dtype ? grad : grad.to(p.dtype).contiguous();
  const bool ta = p.a.trans, tb = p.b.trans;
  const int64_t sa = p.m * p.k, sb = p.shared_b ? 0 : p.k * p.n, sg = p.m * p.n;
  Tensor da, db;
  if (need_a) {
    da = Tensor::empty(p.a.shape, p.dtype, g.device());
    if (!ta && p.shared_b)
      gemm(da, false, !tb, p.batch * p.m, p.k, p.n, g, 0, p.b.data, 0, 0, 1);
    else if (!ta)
      gemm(da, false, !tb, p.m, p.k, p.n, g, sg, p.b.data, sb, sa, p.batch);
    else
      gemm(da, tb, true, p.k, p.m, p.n, p.b.data, sb, g, sg, sa, p.batch);
  }
  if (need_b) {
    db = Tensor::empty(p.b.shape, p.dtype, g.device());
    const int64_t sdb = p.shared_b ? 0 : p.k * p.n;  // 0: sum the batch into one gradient
    const bool flatten = p.shared_b && !ta;          // contract over all batch rows in one GEMM
    if (!tb) {
      if (flatten)
        gemm(db, true, false, p.k, p.n, p.batch * p.m, p.a.data, 0, g, 0, 0, 1);
      else
        gemm(db, !ta, false, p.k, p.n, p.m, p.a.data, sa, g, sg, sdb, p.batch);
    } else {
      if (flatten)
        gemm(db, true, false, p.n, p.k, p.batch * p.m, g, 0, p.a.data, 0, 0, 1);
      else
        gemm(db, true, ta, p.n, p.k, p.m, g, sg, p.a.data, sa, sdb, p.batch);
    }
  }
  return {da, db};
}

// linear's one GEMM: x's leading dims become its rows, y[R, out] = x[R, in] weight[out, in]^T.
Product linear_product(const Tensor& x, const Tensor& weight) {
  const int64_t out_features = weight.size(0), in_features = weight.size(1);
  int64_t rows = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) rows *= x.size(i);
  Tensor x2 = x.detach();
  if (x.dim() != 2) {
    Tensor c = x2.contiguous();
    x2 = make_view(c, {rows, in_features}, {in_features, 1}, c.offset());
  }
  return Product{gemm_operand(x2, false),
                 gemm_operand(weight, true),
                 1,
                 rows,
                 out_features,
                 in_features,
                 true,
                 x.dtype()};
}

// linear's gradients from its product (what it saved; x's data is needed for the weight's
// gradient, the weight's for x's) and the output's gradient.
LinearGrads linear_grads(const Product& saved, const Shape& x_shape, const Tensor& grad,
                         bool need_x, bool need_w, bool need_bias) {
  Tensor g = grad.contiguous();
  auto [dx, dw] = product_backward(saved, g, need_x, need_w);
  LinearGrads out;
  if (need_bias) {  // column sums of g viewed as [R, out], in f32
    const Tensor g32 = g.dtype() == DType::kF32 ? g : g.to(DType::kF32).contiguous();
    out.bias = Tensor::empty({saved.n}, DType::kF32, g.device());
    if (g.device().is_cpu()) {
      kernels::cpu::sum_dim(g32.data<float>(), out.bias.data<float>(), 1, saved.m, saved.n, 1.0);
    } else {
      LOOM_IF_CUDA(kernels::cuda::sum_dim(g32.data<float>(), out.bias.data<float>(), 1, saved.m,
                                          saved.n, 1.0, cuda_stream(g.device())));
    }
    if (saved.dtype != DType::kF32) out.bias = out.bias.to(saved.dtype);
  }
  if (need_x) {
    out.x = unflip(dx, saved.a);
    if (out.x.shape() != x_shape) out.x = reshape(out.x, x_shape);  // [R, in] back: a view
  }
  if (need_w) out.weight = unflip(dw, saved.b);
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  // See Note [Low-precision compute]. A transposed bf16 view upcasts to a contiguous f32 copy,
  // which the f32 path then takes as is.
  const detail::LowPrecision lp("matmul", {{"a", a}, {"b", b}});
  const bool bf16 = cuda_bf16(a, b);  // See Note [bf16 GEMMs on CUDA]
  if (lp && !bf16) return lp.round(matmul(lp.f32(a), lp.f32(b), transpose_a, transpose_b));
  if (!bf16) {
    detail::check_f32("matmul", "a", a);
    detail::check_f32("matmul", "b", b);
  }
  detail::check_same_device("matmul", "a", a, "b", b);
  LOOM_CHECK(a.dim() >= 2, "matmul: 'a' must have at least 2 dims ([..., M, K]), got shape ",
             shape_str(a.shape()));
  const Shape lead(a.shape().begin(), a.shape().end() - 2);
  const bool shared_b = b.dim() == 2;
  LOOM_CHECK(
      shared_b || (b.dim() == a.dim() && std::equal(lead.begin(), lead.end(), b.shape().begin())),
      "matmul: 'b' must be 2-D (shared by every batch entry) or have a's leading dims ",
      shape_str(lead), ", got a ", shape_str(a.shape()), " and b ", shape_str(b.shape()));
  const int64_t m = transpose_a ? a.size(-1) : a.size(-2);
  const int64_t k = transpose_a ? a.size(-2) : a.size(-1);
  const int64_t kb = transpose_b ? b.size(-1) : b.size(-2);
  const int64_t n = transpose_b ? b.size(-2) : b.size(-1);
  LOOM_CHECK(k == kb, "matmul: inner dims differ: a is ", shape_str(a.shape()),
             transpose_a ? " transposed" : "", " (K=", k, "), b is ", shape_str(b.shape()),
             transpose_b ? " transposed" : "", " (K=", kb, ")");

  Product p{gemm_operand(a, transpose_a),
            gemm_operand(b, transpose_b),
            shape_numel(lead),
            m,
            n,
            k,
            shared_b,
            a.dtype()};
  Shape out_shape = lead;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  product_forward(p, out, 0.0f);

  // Each operand is kept only when the other one's gradient needs it.
  Product saved = p;
  if (!b.requires_grad()) saved.a.data = Tensor();
  if (!a.requires_grad()) saved.b.data = Tensor();
  autograd::record(out, "matmul", {a, b}, {saved.a.data, saved.b.data},
                   [saved](const Tensor& grad) {
                     const bool need_a = saved.b.data.defined(), need_b = saved.a.data.defined();
                     auto [da, db] = product_backward(saved, grad.contiguous(), need_a, need_b);
                     return std::vector<Tensor>{need_a ? unflip(da, saved.a) : Tensor(),
                                                need_b ? unflip(db, saved.b) : Tensor()};
                   });
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const detail::LowPrecision lp("linear", {{"x", x}, {"weight", weight}, {"bias", bias}});
  // See Note [bf16 GEMMs on CUDA]: x and weight bf16 on CUDA, the bias (if any) too.
  const bool bf16 = cuda_bf16(x, weight) &&
                    (!bias.defined() || (cuda_bf16(x, bias) && bias.dtype() == DType::kBF16));
  if (lp && !bf16) return lp.round(linear(lp.f32(x), lp.f32(weight), lp.f32(bias)));
  if (!bf16) {
    detail::check_f32("linear", "x", x);
    detail::check_f32("linear", "weight", weight);
  }
  detail::check_same_device("linear", "x", x, "weight", weight);
  LOOM_CHECK(weight.dim() == 2, "linear: 'weight' must be 2-D [out, in], got shape ",
             shape_str(weight.shape()));
  LOOM_CHECK(x.dim() >= 1, "linear: 'x' must be [..., in], got a 0-D tensor");
  const int64_t out_features = weight.size(0), in_features = weight.size(1);
  LOOM_CHECK(x.size(-1) == in_features, "linear: 'x' has ", x.size(-1),
             " features in its last dim (shape ", shape_str(x.shape()), ") but 'weight' ",
             shape_str(weight.shape()), " expects ", in_features);
  if (bias.defined()) {
    if (!bf16) detail::check_f32("linear", "bias", bias);
    detail::check_same_device("linear", "x", x, "bias", bias);
    LOOM_CHECK(bias.shape() == Shape{out_features}, "linear: 'bias' must have shape [",
               out_features, "] to match 'weight' ", shape_str(weight.shape()), ", got ",
               shape_str(bias.shape()));
  }

  const Product p = linear_product(x, weight);
  const int64_t rows = p.m;
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_features);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  const Device device = x.device();
  if (bf16 && bias.defined()) {
    // One cuBLASLt call: the GEMM with the f32 bias added in its epilogue.
    if (rows > 0 && out_features > 0) {
      const Tensor bias32 = bias.detach().to(DType::kF32).contiguous();
      const bool ta = p.a.trans, tb = p.b.trans;
      LOOM_IF_CUDA(kernels::cuda::gemm_bias(
          ta, tb, rows, out_features, in_features, p.a.data.data<BFloat16>(),
          ta ? rows : in_features, p.b.data.data<BFloat16>(), tb ? in_features : out_features,
          bias32.data<float>(), /*gelu=*/false, nullptr, out.data<BFloat16>(), out_features,
          cuda_stream(device)));
    }
  } else if (bias.defined()) {
    // Every row starts as the bias and the GEMM adds onto it (beta = 1): no extra pass over y.
    Tensor bc = bias.detach().contiguous();
    if (device.is_cpu()) {
      kernels::cpu::broadcast_dim(bc.data<float>(), out.data<float>(), 1, rows, out_features, 1.0f);
    } else {
      LOOM_IF_CUDA(kernels::cuda::broadcast_dim(bc.data<float>(), out.data<float>(), 1, rows,
                                                out_features, 1.0f, cuda_stream(device)));
    }
  }
  if (!(bf16 && bias.defined())) product_forward(p, out, bias.defined() ? 1.0f : 0.0f);

  Product saved = p;
  if (!weight.requires_grad()) saved.a.data = Tensor();
  if (!x.requires_grad()) saved.b.data = Tensor();
  const bool need_bias = bias.defined() && bias.requires_grad();
  const Shape x_shape = x.shape();
  autograd::record(out, "linear", {x, weight, bias}, {saved.a.data, saved.b.data},
                   [saved, need_bias, x_shape](const Tensor& grad) {
                     const LinearGrads g =
                         linear_grads(saved, x_shape, grad, saved.b.data.defined(),
                                      saved.a.data.defined(), need_bias);
                     return std::vector<Tensor>{g.x, g.weight, g.bias};
                   });
  return out;
}

LinearGrads linear_backward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& grad, bool need_x, bool need_weight, bool need_bias) {
  LOOM_CHECK(x.defined() && weight.defined() && grad.defined() && weight.dim() == 2 &&
                 x.dim() >= 1 && x.size(-1) == weight.size(1),
             "linear_backward: x [..., in] and weight [out, in] must match, got ",
             x.defined() ? shape_str(x.shape()) : "undefined", " and ",
             weight.defined() ? shape_str(weight.shape()) : "undefined");
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(weight.size(0));
  LOOM_CHECK(grad.shape() == out_shape, "linear_backward: the output's gradient must be ",
             shape_str(out_shape), ", got ", shape_str(grad.shape()));
  NoGradGuard no_grad;
  need_bias = need_bias && bias.defined();
  const detail::LowPrecision lp("linear_backward", {{"x", x}, {"weight", weight}, {"bias", bias}});
  const bool bf16 = cuda_bf16(x, weight) &&
                    (!bias.defined() || (cuda_bf16(x, bias) && bias.dtype() == DType::kBF16));
  if (lp && !bf16) {
    // The chain linear's low-precision path records: its rounding's backward widens the
    // gradient, the f32 linear's runs, and each upcast's rounds its gradient back.
    LinearGrads g = linear_backward(lp.f32(x), lp.f32(weight), lp.f32(bias), grad.to(DType::kF32),
                                    need_x, need_weight, need_bias);
    if (g.x.defined()) g.x = g.x.to(x.dtype());
    if (g.weight.defined()) g.weight = g.weight.to(weight.dtype());
    if (g.bias.defined()) g.bias = g.bias.to(bias.dtype());
    return g;
  }
  return linear_grads(linear_product(x, weight), x.shape(), grad, need_x, need_weight, need_bias);
}

}  // namespace loom
