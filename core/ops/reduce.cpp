// sum and mean, over all elements or over one dim. Both are one kernel, sum_dim, over the input
// viewed as [outer, size, inner] with a scale (1 or 1/size); their backward is the matching
// broadcast of the output gradient back over the reduced dim. bf16/f16 inputs give a bf16/f16
// result, the whole-tensor forms included: See Note [Low-precision compute].
#include "kernels/cpu/reduce.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#include "kernels/cuda/reduce.h"

namespace loom {

namespace {

// x viewed as [outer, size, inner], reduced over `size`.
struct ReduceShape {
  int64_t outer = 1, size = 1, inner = 1;
};

ReduceShape reduce_shape(const Shape& s, int64_t dim) {
  ReduceShape r;
  for (int64_t i = 0; i < int64_t(s.size()); ++i) {
    if (i < dim) r.outer *= s[size_t(i)];
    if (i == dim) r.size = s[size_t(i)];
    if (i > dim) r.inner *= s[size_t(i)];
  }
  return r;
}

Tensor run_sum(const Tensor& x, const Shape& out_shape, ReduceShape r, double scale) {
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(out_shape, DType::kF32, in.device());
  if (in.device().is_cpu()) {
    kernels::cpu::sum_dim(in.data<float>(), out.data<float>(), r.outer, r.size, r.inner, scale);
  } else {
    LOOM_IF_CUDA(kernels::cuda::sum_dim(in.data<float>(), out.data<float>(), r.outer, r.size,
                                        r.inner, scale, cuda_stream(in.device())));
  }
  return out;
}

// The gradient of run_sum: each input element receives scale * its output's gradient.
Tensor run_broadcast(const Tensor& grad, const Shape& in_shape, ReduceShape r, double scale) {
  Tensor g = grad.contiguous();
  Tensor out = Tensor::empty(in_shape, DType::kF32, g.device());
  if (g.device().is_cpu()) {
    kernels::cpu::broadcast_dim(g.data<float>(), out.data<float>(), r.outer, r.size, r.inner,
                                float(scale));
  } else {
    LOOM_IF_CUDA(kernels::cuda::broadcast_dim(g.data<float>(), out.data<float>(), r.outer, r.size,
                                              r.inner, float(scale), cuda_stream(g.device())));
  }
  return out;
}

Tensor reduce_all(const char* op, const Tensor& x, bool mean) {
  const detail::LowPrecision lp(op, {{"x", x}});
  if (lp) return lp.round(reduce_all(op, lp.f32(x), mean));
  detail::check_f32(op, "x", x);
  ReduceShape r{1, x.numel(), 1};
  // mean of nothing is 0 * inf = NaN, as in PyTorch
  const double scale = mean ? 1.0 / double(r.size) : 1.0;
  Tensor out = run_sum(x, {}, r, scale);
  Shape in_shape = x.shape();
  autograd::record(out, op, {x}, {}, [in_shape, r, scale](const Tensor& g) {
    return std::vector<Tensor>{run_broadcast(g, in_shape, r, scale)};
  });
  return out;
}

Tensor reduce_dim(const char* op, const Tensor& x, int64_t dim, bool keepdim, bool mean) {
  const detail::LowPrecision lp(op, {{"x", x}});
  if (lp) return lp.round(reduce_dim(op, lp.f32(x), dim, keepdim, mean));
  detail::check_f32(op, "x", x);
  dim = detail::wrap_dim(op, dim, x.dim());
  ReduceShape r = reduce_shape(x.shape(), dim);
  Shape out_shape = x.shape();
  if (!out_shape.empty()) {  // a 0-D tensor reduced over its one implicit dim stays 0-D
    if (keepdim)
      out_shape[size_t(dim)] = 1;
    else
      out_shape.erase(out_shape.begin() + dim);
  }
  const double scale = mean ? 1.0 / double(r.size) : 1.0;
  Tensor out = run_sum(x, out_shape, r, scale);
  Shape in_shape = x.shape();
  autograd::record(out, op, {x}, {}, [in_shape, r, scale](const Tensor& g) {
    return std::vector<Tensor>{run_broadcast(g, in_shape, r, scale)};
  });
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) {
  if (auto integer = detail::integer_sum_all(x)) return *integer;
  return reduce_all("sum", x, false);
}
Tensor mean(const Tensor& x) { return reduce_all("mean", x, true); }
Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  if (auto integer = detail::integer_sum_dim(x, dim, keepdim)) return *integer;
  return reduce_dim("sum", x, dim, keepdim, false);
}
Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  return reduce_dim("mean", x, dim, keepdim, true);
}

namespace {

// The backward of a selection along a dim: dx is zero but at the chosen places, which get the
// gradient of the values there. values / chosen: [outer, k, inner] of r's view of x.
void record_scatter_backward(const char* op, const Tensor& x, Tensor& values, const Tensor& chosen,
                             const ReduceShape& r, int64_t k) {
  const Shape in_shape = x.shape();
  autograd::record(values, op, {x}, {}, [in_shape, r, chosen, k](const Tensor& grad) {
    Tensor g = grad.contiguous();
    Tensor dx = Tensor::empty(in_shape, DType::kF32, g.device());
    if (g.device().is_cpu()) {
      kernels::cpu::scatter_dim(g.data<float>(), chosen.data<int64_t>(), dx.data<float>(), r.outer,
                                r.size, r.inner, k);
    } else {
      LOOM_IF_CUDA(kernels::cuda::scatter_dim(g.data<float>(), chosen.data<int64_t>(),
                                              dx.data<float>(), r.outer, r.size, r.inner, k,
                                              cuda_stream(g.device())));
    }
    return std::vector<Tensor>{dx};
  });
}

ValuesIndices extreme(const char* op, const Tensor& x, int64_t dim, bool keepdim, bool largest) {
  const detail::LowPrecision lp(op, {{"x", x}});
  if (lp) {  // every bf16/f16 value is exact in f32, so the choice is the same
    ValuesIndices r = extreme(op, lp.f32(x), dim, keepdim, largest);
    return {lp.round(r.values), r.indices};
  }
  detail::check_f32(op, "x", x);
  LOOM_CHECK(x.dim() >= 1, op, ": a 0-d tensor has no dim to reduce (use its value)");
  dim = detail::wrap_dim(op, dim, x.dim());
  LOOM_CHECK(x.size(dim) > 0, op, ": dim ", dim, " of ", shape_str(x.shape()),
             " is empty, and an empty dim has no ", largest ? "largest" : "smallest", " element");
  const ReduceShape r = reduce_shape(x.shape(), dim);
  Shape out_shape = x.shape();
  if (keepdim)
    out_shape[size_t(dim)] = 1;
  else
    out_shape.erase(out_shape.begin() + dim);
  Tensor in = x.detach().contiguous();
  Tensor values = Tensor::empty(out_shape, DType::kF32, in.device());
  Tensor indices = Tensor::empty(out_shape, DType::kI64, in.device());
  if (in.device().is_cpu()) {
    kernels::cpu::extreme_dim(in.data<float>(), values.data<float>(), indices.data<int64_t>(),
                              r.outer, r.size, r.inner, largest);
  } else {
    LOOM_IF_CUDA(kernels::cuda::extreme_dim(in.data<float>(), values.data<float>(),
                                            indices.data<int64_t>(), r.outer, r.size, r.inner,
                                            largest, cuda_stream(in.device())));
  }
  record_scatter_backward(op, x, values, indices, r, 1);
  return {values, indices};
}

ValuesIndices top_k(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  const char* op = "topk";
  const detail::LowPrecision lp(op, {{"x", x}});
  if (lp) {  // every bf16/f16 value is exact in f32, so the choice is the same
    ValuesIndices r = top_k(lp.f32(x), k, dim, largest);
    return {lp.round(r.values), r.indices};
  }
  detail::check_f32(op, "x", x);
  const Tensor shaped = x.dim() == 0 ? x.reshape({1}) : x;  // a 0-d tensor is its own dim
  dim = detail::wrap_dim(op, dim, shaped.dim());
  LOOM_CHECK(k >= 0 && k <= shaped.size(dim), op, ": k = ", k, " is out of range for dim ", dim,
             " of size ", shaped.size(dim));
  const ReduceShape r = reduce_shape(shaped.shape(), dim);
  Shape out_shape = shaped.shape();
  out_shape[size_t(dim)] = k;
  Tensor in = shaped.detach().contiguous();
  Tensor values = Tensor::empty(out_shape, DType::kF32, in.device());
  Tensor indices = Tensor::empty(out_shape, DType::kI64, in.device());
  if (values.numel() > 0) {
    if (in.device().is_cpu()) {
      kernels::cpu::topk_dim(in.data<float>(), values.data<float>(), indices.data<int64_t>(),
                             r.outer, r.size, r.inner, k, largest);
    } else {
      LOOM_IF_CUDA(kernels::cuda::topk_dim(in.data<float>(), values.data<float>(),
                                           indices.data<int64_t>(), r.outer, r.size, r.inner, k,
                                           largest, cuda_stream(in.device())));
    }
  }
  if (x.dim() == 0) {
    values = values.reshape({});
    indices = indices.reshape({});
  }
  record_scatter_backward(op, x, values, indices, r, k);
  return {values, indices};
}

}  // namespace

ValuesIndices max_dim(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme("max", x, dim, keepdim, true);
}
ValuesIndices min_dim(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme("min", x, dim, keepdim, false);
}
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  return top_k(x, k, dim, largest);
}

}  // namespace loom
