#include "core/ops/checks.h"

#include <algorithm>

#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"

namespace loom::detail {

void check_defined(const char* op, const char* arg, const Tensor& t) {
  LOOM_CHECK(t.defined(), op, ": argument '", arg, "' is undefined");
}

void check_f32(const char* op, const char* arg, const Tensor& t) {
  check_defined(op, arg, t);
  LOOM_CHECK(t.dtype() == DType::kF32, op, ": argument '", arg, "' has dtype ",
             dtype_name(t.dtype()), ", expected f32");
}

void check_index(const char* op, const char* arg, const Tensor& t) {
  check_defined(op, arg, t);
  LOOM_CHECK(t.dtype() == DType::kI32 || t.dtype() == DType::kI64, op, ": argument '", arg,
             "' has dtype ", dtype_name(t.dtype()), ", expected i32 or i64");
}

void check_same_device(const char* op, const char* arg_a, const Tensor& a, const char* arg_b,
                       const Tensor& b) {
  LOOM_CHECK(a.device() == b.device(), op, ": '", arg_a, "' is on ", a.device().str(), " but '",
             arg_b, "' is on ", b.device().str());
}

void check_dim(const char* op, const char* arg, const Tensor& t, int64_t dims) {
  check_defined(op, arg, t);
  LOOM_CHECK(t.dim() == dims, op, ": argument '", arg, "' must be ", dims, "-D, got shape ",
             shape_str(t.shape()));
}

int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  LOOM_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " out of range for a ", ndim,
             "-D tensor (expected [", lo, ", ", hi, "])");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

bool is_suffix(const Shape& small, const Shape& big) {
  if (small.size() > big.size()) return false;
  return std::equal(small.begin(), small.end(), big.end() - int64_t(small.size()));
}

Tensor sum_to_suffix(const Tensor& grad, const Shape& to) {
  if (grad.shape() == to) return grad;
  Tensor g = grad.contiguous();
  const int64_t cols = shape_numel(to);
  const int64_t rows = cols > 0 ? g.numel() / cols : 0;
  Tensor out = Tensor::empty(to, DType::kF32, g.device());
  if (g.device().is_cpu()) {
    kernels::cpu::sum_rows(g.data<float>(), out.data<float>(), rows, cols);
  } else {
    LOOM_IF_CUDA(kernels::cuda::sum_rows(g.data<float>(), out.data<float>(), rows, cols,
                                         cuda_stream(g.device())));
  }
  return out;
}

Shape broadcast_shape(const char* op, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {  // i counts from the last dim
    const int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    LOOM_CHECK(x == y || x == 1 || y == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
               " do not broadcast (dim ", int64_t(n - 1 - i), " of the result: ", x, " vs ", y,
               "; sizes must be equal or 1, aligned at the last dim)");
    out[n - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

std::pair<Tensor, Tensor> broadcast_for_kernels(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() == b.shape() || is_suffix(a.shape(), b.shape()) || is_suffix(b.shape(), a.shape()))
    return {a, b};
  const Shape to = broadcast_shape(op, a.shape(), b.shape());
  auto ready = [&](const Tensor& t) { return is_suffix(t.shape(), to) ? t : expand(t, to); };
  return {ready(a), ready(b)};
}

}  // namespace loom::detail
