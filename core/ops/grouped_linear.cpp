// grouped_linear: a mixture of experts' linear layers in one call, on rows sorted by expert.
//
// Note [Grouped linear]
// y[rows of group g] = x[rows of group g] weights[g]^T + biases[g], for groups of consecutive
// rows (row_counts[g] of them, in order). f32 on the CPU and CUDA runs one grouped GEMM per
// product (kernels/cpu/grouped_gemm.h, kernels/cuda/grouped_gemm.h: cuBLAS's grouped GEMM, one
// launch for every expert): forward, the input's gradient and every weight's gradient, with
// each bias's gradient the column sums of its rows. Each group computes exactly what linear()
// computes for its rows (the bias placed first, the GEMM adding onto it; the same GEMM calls on
// the CPU), so on the CPU the results are linear()'s bit for bit. Other dtypes (bf16, whose CUDA
// GEMMs are cuBLAS's bf16 ones) run each group through linear() and concatenate.
#include <numeric>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "kernels/cpu/grouped_gemm.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/reduce.h"

namespace loom {

namespace {

// Device pointers of each tensor's data, as the kernels take them.
template <typename P>
std::vector<P> data_pointers(const std::vector<Tensor>& ts) {
  std::vector<P> out;
  for (const Tensor& t : ts) out.push_back(t.data<float>());
  return out;
}

// The rows of each group placed as its bias (beta = 1 then adds the products onto them).
void place_biases(Tensor& out, const std::vector<Tensor>& biases,
                  const std::vector<int64_t>& rows) {
  const int64_t n = out.size(1);
  int64_t first = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    if (rows[g] > 0) {
      const Tensor b = biases[g].detach().contiguous();
      float* dst = out.data<float>() + first * n;
      if (out.device().is_cpu()) {
        kernels::cpu::broadcast_dim(b.data<float>(), dst, 1, rows[g], n, 1.0f);
      } else {
        LOOM_IF_CUDA(kernels::cuda::broadcast_dim(b.data<float>(), dst, 1, rows[g], n, 1.0f,
                                                  cuda_stream(out.device())));
      }
    }
    first += rows[g];
  }
}

void run_grouped(bool trans_b, const std::vector<int64_t>& rows, int64_t n, int64_t k,
                 const Tensor& a, const std::vector<Tensor>& b, float beta, Tensor& c) {
  const std::vector<const float*> bp = data_pointers<const float*>(b);
  const auto groups = int64_t(rows.size());
  const int64_t ldb = trans_b ? k : n;
  if (c.device().is_cpu()) {
    kernels::cpu::grouped_gemm(trans_b, rows.data(), groups, n, k, 1.0f, a.data<float>(), k,
                               bp.data(), ldb, beta, c.data<float>(), n);
    return;
  }
  LOOM_IF_CUDA({
    const size_t bytes = kernels::cuda::grouped_gemm_workspace_bytes(groups);
    Tensor ws = cuda_workspace(c.device(), bytes);
    kernels::cuda::grouped_gemm(trans_b, rows.data(), groups, n, k, 1.0f, a.data<float>(), k,
                                bp.data(), ldb, beta, c.data<float>(), n, ws.data_ptr(), bytes,
                                cuda_stream(c.device()));
  });
}

void run_grouped_tn(const std::vector<int64_t>& rows, int64_t m, int64_t n, const Tensor& a,
                    const Tensor& b, std::vector<Tensor>& c) {
  const std::vector<float*> cp = data_pointers<float*>(c);
  const auto groups = int64_t(rows.size());
  if (a.device().is_cpu()) {
    kernels::cpu::grouped_gemm_tn(rows.data(), groups, m, n, 1.0f, a.data<float>(), m,
                                  b.data<float>(), n, 0.0f, cp.data(), n);
    return;
  }
  LOOM_IF_CUDA({
    const size_t bytes = kernels::cuda::grouped_gemm_workspace_bytes(groups);
    Tensor ws = cuda_workspace(a.device(), bytes);
    kernels::cuda::grouped_gemm_tn(rows.data(), groups, m, n, 1.0f, a.data<float>(), m,
                                   b.data<float>(), n, 0.0f, cp.data(), n, ws.data_ptr(), bytes,
                                   cuda_stream(a.device()));
  });
}

}  // namespace

Tensor grouped_linear(const Tensor& x, const std::vector<int64_t>& row_counts,
                      const std::vector<Tensor>& weights, const std::vector<Tensor>& biases) {
  const size_t groups = weights.size();
  LOOM_CHECK(x.defined() && x.dim() == 2, "grouped_linear: 'x' must be [rows, in], got ",
             x.defined() ? shape_str(x.shape()) : "undefined");
  LOOM_CHECK(groups > 0 && row_counts.size() == groups, "grouped_linear: ", row_counts.size(),
             " row counts for ", groups, " weights");
  LOOM_CHECK(biases.empty() || biases.size() == groups, "grouped_linear: ", biases.size(),
             " biases for ", groups, " weights (give one per weight, or none)");
  int64_t total = 0;
  for (int64_t r : row_counts) {
    LOOM_CHECK(r >= 0, "grouped_linear: a row count is negative (", r, ")");
    total += r;
  }
  LOOM_CHECK(total == x.size(0), "grouped_linear: the row counts add up to ", total, " but 'x' ",
             shape_str(x.shape()), " has ", x.size(0), " rows");
  const int64_t in = x.size(1), out_features = weights[0].defined() ? weights[0].size(0) : 0;
  bool all_f32 = x.dtype() == DType::kF32;
  for (size_t g = 0; g < groups; ++g) {
    const Tensor& w = weights[g];
    LOOM_CHECK(w.defined() && w.dim() == 2 && w.size(0) == out_features && w.size(1) == in,
               "grouped_linear: weight ", g, " must be [", out_features, ", ", in, "], got ",
               w.defined() ? shape_str(w.shape()) : "undefined");
    detail::check_same_device("grouped_linear", "x", x, "weight", w);
    all_f32 = all_f32 && w.dtype() == DType::kF32;
    if (!biases.empty()) {
      const Tensor& b = biases[g];
      LOOM_CHECK(b.defined() && b.shape() == Shape{out_features}, "grouped_linear: bias ", g,
                 " must be [", out_features, "], got ",
                 b.defined() ? shape_str(b.shape()) : "undefined");
      detail::check_same_device("grouped_linear", "x", x, "bias", b);
      all_f32 = all_f32 && b.dtype() == DType::kF32;
    }
  }
  if (!all_f32) {  // See Note [Grouped linear]: each group through linear()
    std::vector<Tensor> parts;
    int64_t first = 0;
    for (size_t g = 0; g < groups; ++g) {
      parts.push_back(linear(narrow(x, 0, first, row_counts[g]), weights[g],
                             biases.empty() ? Tensor() : biases[g]));
      first += row_counts[g];
    }
    return cat(parts, 0);
  }

  const Tensor xc = x.detach().contiguous();
  std::vector<Tensor> ws;
  for (const Tensor& w : weights) ws.push_back(w.detach().contiguous());
  Tensor out = Tensor::empty({total, out_features}, DType::kF32, x.device());
  if (!biases.empty()) place_biases(out, biases, row_counts);
  if (total > 0 && out_features > 0)
    run_grouped(/*trans_b=*/true, row_counts, out_features, in, xc, ws,
                biases.empty() ? 0.0f : 1.0f, out);

  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  inputs.insert(inputs.end(), biases.begin(), biases.end());
  bool need_w = false, need_b = false;
  for (const Tensor& w : weights) need_w = need_w || w.requires_grad();
  for (const Tensor& b : biases) need_b = need_b || b.requires_grad();
  const bool need_x = x.requires_grad();
  std::vector<Tensor> saved;
  if (need_w) saved.push_back(xc);
  if (need_x) saved.insert(saved.end(), ws.begin(), ws.end());
  const bool has_bias = !biases.empty();
  autograd::record(
      out, "grouped_linear", inputs, saved,
      [xc = need_w ? xc : Tensor(), ws = need_x ? ws : std::vector<Tensor>(), row_counts, need_x,
       need_w, need_b, has_bias, in, out_features, total](const Tensor& grad) {
        const Tensor g = grad.contiguous();
        const size_t count = row_counts.size();
        std::vector<Tensor> grads;
        if (need_x) {  // dx_g = g_g W_g
          Tensor dx = Tensor::empty({total, in}, DType::kF32, g.device());
          if (total > 0 && in > 0) {
            if (out_features > 0)
              run_grouped(/*trans_b=*/false, row_counts, in, out_features, g, ws, 0.0f, dx);
            else
              dx.zero_();
          }
          grads.push_back(dx);
        } else {
          grads.push_back(Tensor());
        }
        std::vector<Tensor> dws(count);
        if (need_w) {  // dW_g = g_g^T x_g
          for (Tensor& d : dws) d = Tensor::empty({out_features, in}, DType::kF32, g.device());
          run_grouped_tn(row_counts, out_features, in, g, xc, dws);
        }
        grads.insert(grads.end(), dws.begin(), dws.end());
        if (has_bias) {
          int64_t first = 0;
          for (size_t i = 0; i < count; ++i) {  // db_g: the column sums of g_g
            Tensor db;
            if (need_b) {
              db = Tensor::zeros({out_features}, DType::kF32, g.device());
              const float* src = g.data<float>() + first * out_features;
              if (row_counts[i] > 0) {
                if (g.device().is_cpu()) {
                  kernels::cpu::sum_dim(src, db.data<float>(), 1, row_counts[i], out_features, 1.0);
                } else {
                  LOOM_IF_CUDA(kernels::cuda::sum_dim(src, db.data<float>(), 1, row_counts[i],
                                                      out_features, 1.0, cuda_stream(g.device())));
                }
              }
            }
            grads.push_back(db);
            first += row_counts[i];
          }
        }
        return grads;
      });
  return out;
}

}  // namespace loom
