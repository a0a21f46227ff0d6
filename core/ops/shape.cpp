// reshape / transpose / narrow are views (no copy); cat copies; split and chunk are narrows. All of
// them move bytes and work on any dtype; only cat of mixed f32 and bf16/f16 inputs converts (See
// Note [Low-precision compute]).
#include <algorithm>
#include <cstring>
#include <optional>

#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"

namespace loom {

namespace {

// Copies `rows` rows of `width` bytes from src (rows src_pitch apart) to dst (dst_pitch apart),
// both on `device`.
void copy_rows(Device device, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
               size_t width, int64_t rows) {
  if (width == 0 || rows == 0) return;
  if (device.is_cpu()) {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, width);
  } else {
    cuda_stream(device);
    cuda_rt::copy_2d_device(dst, dst_pitch, src, src_pitch, width, size_t(rows));
  }
}

// Sizes of the dims before and after `dim`.
int64_t outer_size(const Shape& s, int64_t dim) {
  int64_t n = 1;
  for (int64_t i = 0; i < dim; ++i) n *= s[i];
  return n;
}
int64_t inner_size(const Shape& s, int64_t dim) {
  int64_t n = 1;
  for (size_t i = size_t(dim) + 1; i < s.size(); ++i) n *= s[i];
  return n;
}

}  // namespace

namespace {

// One -1 in `shape` filled in for x's element count; the counts must agree. `op` names the caller.
Shape resolved_shape(const char* op, const Tensor& x, const Shape& shape) {
  Shape target = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == -1) {
      LOOM_CHECK(infer < 0, op, ": more than one -1 in ", shape_str(shape));
      infer = int64_t(i);
    } else {
      LOOM_CHECK(target[i] >= 0, op, ": negative size in ", shape_str(shape));
      known *= target[i];
    }
  }
  if (infer >= 0) {
    LOOM_CHECK(known > 0 && x.numel() % known == 0, op, ": cannot infer -1 in ", shape_str(shape),
               " for ", x.numel(), " elements");
    target[infer] = x.numel() / known;
  }
  LOOM_CHECK(shape_numel(target) == x.numel(), op, ": shape ", shape_str(shape), " has ",
             shape_numel(target), " elements but the tensor ", shape_str(x.shape()), " has ",
             x.numel());
  return target;
}

// The strides under which `target` sees the elements of a tensor (shape, strides) in the same
// row-major order, or nothing when no strides can. The old dims fall into runs that are
// contiguous among themselves (stride[d] == stride[d + 1] * shape[d + 1]); every run must be
// covered by whole new dims, which then step through it with the run's innermost stride.
std::optional<Shape> view_strides(const Shape& shape, const Shape& strides, const Shape& target) {
  if (shape_numel(shape) == 0 || shape.empty()) return contiguous_strides(target);
  Shape out(target.size(), 1);
  int64_t next = int64_t(target.size()) - 1;  // the new dim to place next, from the last
  int64_t run_stride = strides.back(), run_numel = 1;
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    run_numel *= shape[size_t(d)];
    const bool run_ends =
        d == 0 || (shape[size_t(d - 1)] != 1 && strides[size_t(d - 1)] != run_numel * run_stride);
    if (!run_ends) continue;
    int64_t placed = 1;
    while (next >= 0 && (placed < run_numel || target[size_t(next)] == 1)) {
      out[size_t(next)] = placed * run_stride;
      placed *= target[size_t(next)];
      --next;
    }
    if (placed != run_numel) return std::nullopt;
    if (d > 0) {
      run_stride = strides[size_t(d - 1)];
      run_numel = 1;
    }
  }
  for (; next >= 0; --next) out[size_t(next)] = 1;  // trailing size-1 dims (only they are left)
  return out;
}

}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  detail::check_defined("view", "x", x);
  const Shape target = resolved_shape("view", x, shape);
  const std::optional<Shape> strides = view_strides(x.shape(), x.strides(), target);
  LOOM_CHECK(strides.has_value(), "view: no view of the tensor ", shape_str(x.shape()),
             " (strides ", shape_str(x.strides()), ") has the shape ", shape_str(target),
             ": its elements are not evenly spaced there; use reshape (which copies) or "
             ".contiguous() first");
  Tensor out = make_view(x, target, *strides, x.offset());
  Shape original = x.shape();
  autograd::record(out, "view", {x}, {}, [original](const Tensor& g) {
    return std::vector<Tensor>{reshape(g, original)};
  });
  autograd::mark_view(out, x);
  return out;
}

Tensor view_or_reshape(const Tensor& x, const Shape& shape) {
  detail::check_defined("reshape", "x", x);
  if (x.is_contiguous()) return reshape(x, shape);
  const Shape target = resolved_shape("reshape", x, shape);
  return view_strides(x.shape(), x.strides(), target) ? view(x, target) : reshape(x, target);
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  detail::check_defined("reshape", "x", x);
  const Shape target = resolved_shape("reshape", x, shape);
  Tensor base = x.contiguous();  // a view when x is contiguous; else one copy (recorded)
  Tensor out = make_view(base, target, contiguous_strides(target), base.offset());
  Shape original = x.shape();
  autograd::record(out, "reshape", {base}, {}, [original](const Tensor& g) {
    return std::vector<Tensor>{reshape(g, original)};
  });
  autograd::mark_view(out, base);
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  detail::check_defined("transpose", "x", x);
  d0 = detail::wrap_dim("transpose", d0, x.dim());
  d1 = detail::wrap_dim("transpose", d1, x.dim());
  Shape shape = x.shape(), strides = x.strides();
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  Tensor out = make_view(x, shape, strides, x.offset());
  autograd::record(out, "transpose", {x}, {},
                   [d0, d1](const Tensor& g) { return std::vector<Tensor>{transpose(g, d0, d1)}; });
  autograd::mark_view(out, x);
  return out;
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t length, int64_t step) {
  detail::check_defined("slice", "x", x);
  dim = detail::wrap_dim("slice", dim, x.dim());
  LOOM_CHECK(step >= 1, "slice: step must be positive, got ", step);
  const int64_t size = x.size(dim);
  // The last element taken, start + (length - 1) * step, must lie inside the dim; compared by
  // division so that no product overflows.
  LOOM_CHECK(start >= 0 && length >= 0 && start <= size &&
                 (length == 0 || (start < size && (length - 1) <= (size - 1 - start) / step)),
             "slice: ", length, " elements from ", start, " with step ", step, " outside dim ", dim,
             " of size ", size);
  if (step == 1) return narrow(x, dim, start, length);
  Shape shape = x.shape(), strides = x.strides();
  shape[dim] = length;
  strides[dim] *= step;
  Tensor out = make_view(x, shape, strides, x.offset() + start * x.strides()[dim]);
  const Shape full = x.shape();
  const DType dtype = x.dtype();
  autograd::record(out, "slice", {x}, {}, [full, dim, start, length, step, dtype](const Tensor& g) {
    Tensor grad = Tensor::zeros(full, dtype, g.device());
    Tensor(slice(grad, dim, start, length, step)).copy_(g);  // into the strided places
    return std::vector<Tensor>{grad};
  });
  autograd::mark_view(out, x);
  return out;
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  detail::check_defined("narrow", "x", x);
  dim = detail::wrap_dim("narrow", dim, x.dim());
  // Compared without forming start + length, which can overflow int64 (a view out of bounds).
  LOOM_CHECK(start >= 0 && length >= 0 && start <= x.size(dim) && length <= x.size(dim) - start,
             "narrow: range of length ", length, " from ", start, " outside dim ", dim, " of size ",
             x.size(dim));
  Shape shape = x.shape();
  shape[dim] = length;
  Tensor out = make_view(x, shape, x.strides(), x.offset() + start * x.strides()[dim]);
  Shape full = x.shape();
  DType dtype = x.dtype();
  // See Note [Gradients of parts] in core/autograd.h: the part is added into x's gradient.
  autograd::record_part(
      out, "narrow", x, [full, dim, start, length, dtype](const Tensor& g, Tensor& sum) {
        if (sum.defined()) {
          Tensor part = narrow(sum, dim, start, length);
          add_(part, g);
          return;
        }
        Tensor gc = g.contiguous();
        sum = Tensor::zeros(full, dtype, g.device());
        const size_t es = dtype_size(dtype);
        const int64_t inner = inner_size(full, dim);
        copy_rows(g.device(), static_cast<char*>(sum.data_ptr()) + start * inner * es,
                  full[dim] * inner * es, gc.data_ptr(), length * inner * es, length * inner * es,
                  outer_size(full, dim));
      });
  autograd::mark_view(out, x);
  return out;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  detail::check_defined("expand", "x", x);
  LOOM_CHECK(shape.size() >= x.shape().size(), "expand: cannot expand ", shape_str(x.shape()),
             " to ", shape_str(shape), " (fewer dims)");
  // A view whose broadcast dims have stride 0, copied out (contiguous() walks any strides).
  const size_t lead = shape.size() - x.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < x.shape().size(); ++i) {
    const int64_t have = x.shape()[i], want = shape[lead + i];
    LOOM_CHECK(have == want || have == 1, "expand: cannot expand ", shape_str(x.shape()), " to ",
               shape_str(shape), " (dim ", int64_t(lead + i), ": ", have,
               " must equal the target or be 1)");
    strides[lead + i] = have == 1 ? 0 : x.strides()[i];
  }
  for (int64_t d : shape) LOOM_CHECK(d >= 0, "expand: negative size in ", shape_str(shape));
  if (x.shape() == shape) return x.contiguous();
  Tensor out = make_view(x.detach(), shape, strides, x.offset()).contiguous();
  const Shape from = x.shape();
  autograd::record(out, "expand", {x}, {}, [from, lead](const Tensor& g) {
    // Summed over the added leading dims, then over each dim that was 1.
    Tensor grad = g;
    for (size_t i = 0; i < lead; ++i) grad = sum(grad, 0);
    for (size_t i = 0; i < from.size(); ++i)
      if (from[i] == 1 && grad.size(int64_t(i)) != 1) grad = sum(grad, int64_t(i), true);
    return std::vector<Tensor>{grad};
  });
  return out;
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  LOOM_CHECK(!xs.empty(), "cat: no tensors given");
  detail::check_defined("cat", "xs[0]", xs[0]);
  const Tensor& first = xs[0];
  if (is_floating(first.dtype()) && std::any_of(xs.begin(), xs.end(), [&](const Tensor& t) {
        return t.defined() && t.dtype() != first.dtype();
      })) {
    // f32 mixed with bf16 or f16 (other mixtures are refused here or below). Rounding the f32
    // inputs and copying bytes gives exactly the rounded f32 cat, without upcasting the others.
    const detail::LowPrecision lp("cat", "xs", xs);
    std::vector<Tensor> same;
    for (const Tensor& t : xs) same.push_back(t.defined() ? t.to(lp.dtype()) : t);
    return cat(same, dim);
  }
  dim = detail::wrap_dim("cat", dim, first.dim());
  Shape shape = first.shape();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& t = xs[i];
    LOOM_CHECK(t.defined(), "cat: tensor ", i, " is undefined");
    LOOM_CHECK(t.dtype() == first.dtype(), "cat: tensor ", i, " has dtype ", dtype_name(t.dtype()),
               ", tensor 0 has ", dtype_name(first.dtype()));
    LOOM_CHECK(t.device() == first.device(), "cat: tensor ", i, " is on ", t.device().str(),
               ", tensor 0 on ", first.device().str());
    Shape s = t.shape();
    LOOM_CHECK(s.size() == shape.size(), "cat: tensor ", i, " has shape ", shape_str(s),
               ", tensor 0 has ", shape_str(first.shape()));
    s[dim] = shape[dim];
    LOOM_CHECK(s == shape, "cat: tensor ", i, " has shape ", shape_str(t.shape()),
               " which differs from tensor 0's ", shape_str(first.shape()), " outside dim ", dim);
    total += t.size(dim);
  }
  shape[dim] = total;
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  const size_t es = dtype_size(first.dtype());
  const int64_t inner = inner_size(shape, dim), outer = outer_size(shape, dim);
  int64_t at = 0;
  std::vector<int64_t> sizes;
  for (const Tensor& t : xs) {
    Tensor c = t.detach().contiguous();
    copy_rows(out.device(), static_cast<char*>(out.data_ptr()) + at * inner * es,
              total * inner * es, c.data_ptr(), t.size(dim) * inner * es, t.size(dim) * inner * es,
              outer);
    at += t.size(dim);
    sizes.push_back(t.size(dim));
  }
  autograd::record(out, "cat", xs, {}, [sizes, dim](const Tensor& g) {
    std::vector<Tensor> grads;
    int64_t start = 0;
    for (int64_t s : sizes) {
      grads.push_back(narrow(g, dim, start, s));
      start += s;
    }
    return grads;
  });
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  detail::check_defined("split", "x", x);
  dim = detail::wrap_dim("split", dim, x.dim());
  int64_t total = 0;
  for (int64_t s : sizes) {
    LOOM_CHECK(s >= 0, "split: negative size ", s);
    total += s;
  }
  LOOM_CHECK(total == x.size(dim), "split: sizes add up to ", total, " but dim ", dim, " has size ",
             x.size(dim));
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(narrow(x, dim, start, s));
    start += s;
  }
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  detail::check_defined("chunk", "x", x);
  dim = detail::wrap_dim("chunk", dim, x.dim());
  LOOM_CHECK(chunks > 0 && x.size(dim) % chunks == 0, "chunk: dim ", dim, " of size ", x.size(dim),
             " does not split into ", chunks, " equal chunks");
  return split(x, std::vector<int64_t>(size_t(chunks), x.size(dim) / chunks), dim);
}

}  // namespace loom
