// embedding: a row gather. Indices are validated here on the host before the kernel runs, so an
// out-of-range index is an error naming it rather than a wild read.
#include <type_traits>

#include "core/cuda_dispatch.h"
#include "core/dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#include "kernels/cpu/embedding.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/embedding.h"
#endif

namespace loom {

namespace {

// "[1, 2]" for flat position i of `shape`, so the message points into the user's tensor.
std::string position_str(int64_t i, const Shape& shape) {
  Shape pos(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    pos[d] = i % shape[d];
    i /= shape[d];
  }
  return shape_str(pos);
}

template <typename I>
void check_indices(const I* indices, const Shape& shape, int64_t vocab,
                   const char* op = "embedding", const char* rows_of = "the weight") {
  const int64_t n = shape_numel(shape);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = int64_t(indices[i]);
    LOOM_CHECK(v >= 0 && v < vocab, op, ": index ", v, " at position ", position_str(i, shape),
               " of 'indices' ", shape_str(shape), " is outside [0, ", vocab, ") (", rows_of,
               " has ", vocab, " rows)");
  }
}

// The sum of src's rows [n, cols] per row of a [vocab, cols] table (rows no index names are 0):
// embedding's backward kernels, deterministic on both devices.
template <typename I>
void scatter_rows(const Tensor& src, const Tensor& idx, Tensor& out, int64_t n, int64_t vocab,
                  int64_t cols) {
  if (src.device().is_cpu()) {
    kernels::cpu::embedding_backward(src.data<float>(), idx.data<I>(), out.data<float>(), n, vocab,
                                     cols);
  } else {
    LOOM_IF_CUDA({
      const size_t bytes = kernels::cuda::embedding_backward_workspace_bytes(n, vocab);
      Tensor ws = cuda_workspace(src.device(), bytes);
      kernels::cuda::embedding_backward(src.data<float>(), idx.data<I>(), out.data<float>(), n,
                                        vocab, cols, ws.data_ptr(), bytes,
                                        cuda_stream(src.device()));
    });
  }
}

// embedding with a bf16 CUDA weight through the kernels' bf16 overloads (Note [bf16 kernels on
// CUDA]): the gather is exact; the gradient is summed in f32 and rounded to bf16 once.
Tensor embedding_cuda_bf16(const Tensor& weight, const Tensor& indices) {
  detail::check_dim("embedding", "weight", weight, 2);
  detail::check_index("embedding", "indices", indices);
  detail::check_same_device("embedding", "weight", weight, "indices", indices);
  const int64_t vocab = weight.size(0), cols = weight.size(1), n = indices.numel();
  Tensor w = weight.detach().contiguous(), idx = indices.detach().contiguous();
  const Device device = w.device();
  Shape out_shape = indices.shape();
  out_shape.push_back(cols);
  Tensor out = Tensor::empty(out_shape, DType::kBF16, device);
  const Tensor host_idx = idx.to(Device::cpu());  // the range check (no device-side one yet)
  visit_index_dtype(idx.dtype(), [&](auto tag) {
    using I = decltype(tag);
    check_indices(host_idx.data<I>(), idx.shape(), vocab);
    LOOM_IF_CUDA(kernels::cuda::embedding_forward(
        w.data<BFloat16>(), idx.data<I>(), out.data<BFloat16>(), n, cols, cuda_stream(device)));
  });
  autograd::record(out, "embedding", {weight}, {idx}, [idx, vocab, cols, n](const Tensor& grad) {
    Tensor g = grad.to(DType::kBF16).contiguous();
    Tensor dw = Tensor::empty({vocab, cols}, DType::kF32, g.device());
    visit_index_dtype(idx.dtype(), [&](auto tag) {
      using I = decltype(tag);
      LOOM_IF_CUDA({
        const size_t bytes = kernels::cuda::embedding_backward_workspace_bytes(n, vocab);
        Tensor ws = cuda_workspace(g.device(), bytes);
        kernels::cuda::embedding_backward(g.data<BFloat16>(), idx.data<I>(), dw.data<float>(), n,
                                          vocab, cols, ws.data_ptr(), bytes,
                                          cuda_stream(g.device()));
      });
    });
    return std::vector<Tensor>{dw.to(DType::kBF16)};
  });
  return out;
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  // See Note [Low-precision compute]: the gather is exact in any dtype, but the backward's
  // scatter-add must sum in f32, so a bf16 weight is upcast whole like any other input.
  const detail::LowPrecision lp("embedding", {{"weight", weight}});
  if (lp && cuda_bf16_path(weight)) return embedding_cuda_bf16(weight, indices);
  if (lp) return lp.round(embedding(lp.f32(weight), indices));
  detail::check_f32("embedding", "weight", weight);
  detail::check_dim("embedding", "weight", weight, 2);
  detail::check_index("embedding", "indices", indices);
  detail::check_same_device("embedding", "weight", weight, "indices", indices);
  const int64_t vocab = weight.size(0), cols = weight.size(1), n = indices.numel();
  Tensor w = weight.detach().contiguous(), idx = indices.detach().contiguous();
  Shape out_shape = indices.shape();
  out_shape.push_back(cols);
  Tensor out = Tensor::empty(out_shape, DType::kF32, w.device());
  const Device device = w.device();
  // On CUDA the range check reads a host copy of the indices (no device-side check yet).
  const Tensor host_idx = device.is_cpu() ? idx : idx.to(Device::cpu());
  visit_index_dtype(idx.dtype(), [&](auto tag) {
    using I = decltype(tag);
    check_indices(host_idx.data<I>(), idx.shape(), vocab);
    if (device.is_cpu()) {
      kernels::cpu::embedding_forward(w.data<float>(), idx.data<I>(), out.data<float>(), n, cols);
    } else {
      LOOM_IF_CUDA(kernels::cuda::embedding_forward(
          w.data<float>(), idx.data<I>(), out.data<float>(), n, cols, cuda_stream(device)));
    }
  });
  autograd::record(out, "embedding", {weight}, {idx}, [idx, vocab, cols, n](const Tensor& g) {
    Tensor gc = g.contiguous();
    Tensor dw = Tensor::empty({vocab, cols}, DType::kF32, gc.device());
    visit_index_dtype(idx.dtype(),
                      [&](auto tag) { scatter_rows<decltype(tag)>(gc, idx, dw, n, vocab, cols); });
    return std::vector<Tensor>{dw};
  });
  return out;
}

Tensor index_add_rows(const Tensor& x, const Tensor& indices, const Tensor& src) {
  const detail::LowPrecision lp("index_add_rows", {{"x", x}, {"src", src}});
  if (lp) return lp.round(index_add_rows(lp.f32(x), indices, lp.f32(src)));
  detail::check_f32("index_add_rows", "x", x);
  detail::check_f32("index_add_rows", "src", src);
  detail::check_dim("index_add_rows", "x", x, 2);
  detail::check_index("index_add_rows", "indices", indices);
  detail::check_same_device("index_add_rows", "x", x, "indices", indices);
  detail::check_same_device("index_add_rows", "x", x, "src", src);
  const int64_t vocab = x.size(0), cols = x.size(1), n = indices.numel();
  Shape want = indices.shape();
  want.push_back(cols);
  LOOM_CHECK(src.shape() == want, "index_add_rows: src is ", shape_str(src.shape()),
             " but indices ", shape_str(indices.shape()), " and x ", shape_str(x.shape()), " need ",
             shape_str(want), " (one row of x's width per index)");
  Tensor idx = indices.detach().contiguous(), s = src.detach().contiguous();
  const Tensor host_idx = idx.device().is_cpu() ? idx : idx.to(Device::cpu());
  Tensor delta = Tensor::empty({vocab, cols}, DType::kF32, x.device());
  visit_index_dtype(idx.dtype(), [&](auto tag) {
    using I = decltype(tag);
    check_indices(host_idx.data<I>(), idx.shape(), vocab, "index_add_rows", "x");
    scatter_rows<I>(s, idx, delta, n, vocab, cols);
  });
  Tensor out;
  {
    NoGradGuard no_grad;
    out = add(x.detach(), delta);
  }
  const Shape src_shape = src.shape();
  autograd::record(out, "index_add_rows", {x, src}, {idx}, [idx, src_shape](const Tensor& g) {
    return std::vector<Tensor>{g, embedding(g, idx).reshape(src_shape)};
  });
  return out;
}

}  // namespace loom
