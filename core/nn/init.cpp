// Parameter initialisation by name; see Note [Deterministic init] in core/nn/init.h.
#include "core/nn/init.h"

#include <algorithm>

#include "core/autograd.h"

namespace loom::nn {

Init Init::normal(double std) {
  LOOM_CHECK(std >= 0.0, "Init::normal: std must be >= 0, got ", std);
  Init i;
  i.kind = Kind::kNormal;
  i.std = std;
  return i;
}

Init Init::zeros() { return Init{}; }

Init Init::ones() {
  Init i;
  i.kind = Kind::kOnes;
  return i;
}

Init Init::with_zero_rows_from(int64_t row) const {
  LOOM_CHECK(row >= 0, "Init::with_zero_rows_from: row must be >= 0, got ", row);
  Init i = *this;
  i.zero_rows_from = row;
  return i;
}

std::string Init::str() const {
  std::string s = kind == Kind::kNormal ? detail::str_cat("normal(", std, ")")
                  : kind == Kind::kOnes ? "ones"
                                        : "zeros";
  if (zero_rows_from >= 0) s += detail::str_cat(" + zero rows from ", zero_rows_from);
  return s;
}

void init_tensor(Tensor& t, const Init& init, uint64_t seed, const std::string& full_name,
                 const rng::Slice* slice) {
  LOOM_CHECK(t.defined(), "init: parameter '", full_name, "' is undefined");
  NoGradGuard no_grad;
  const rng::Slice whole{t.shape(), 0, 0};
  const rng::Slice& s = slice ? *slice : whole;
  switch (init.kind) {
    case Init::Kind::kNormal:
      rng::fill_normal(t, s, seed, full_name, 0.0, init.std);
      break;
    case Init::Kind::kZeros:
    case Init::Kind::kOnes: {
      // Through a host tensor so any layout or dtype works; the value needs no slice logic.
      Tensor c = Tensor::full(t.shape(), init.kind == Init::Kind::kOnes ? 1.0 : 0.0, t.dtype());
      t.copy_(c);
      break;
    }
  }
  if (init.zero_rows_from < 0 || t.dim() == 0) return;
  // Local rows [lo, size(0)) are global rows >= zero_rows_from; a slice along dim 0 shifts them.
  const int64_t first_global = (s.dim == 0 || s.dim == -t.dim()) ? s.start : 0;
  const int64_t lo = std::clamp<int64_t>(init.zero_rows_from - first_global, 0, t.size(0));
  if (lo == t.size(0)) return;
  Tensor rows = t.narrow(0, lo, t.size(0) - lo);
  rows.copy_(Tensor::zeros(rows.shape(), t.dtype()));
}

ShardSpec ShardSpec::along(const Shape& full_shape, int64_t dim, int64_t start, int64_t length) {
  return ShardSpec{full_shape, full_shape, dim, start, length};
}

Shape ShardSpec::local_view_shape() const {
  Shape s = view_shape;
  s.at(size_t(dim)) = length;
  return s;
}

int64_t ShardSpec::local_numel() const { return shape_numel(local_view_shape()); }

Tensor ShardSpec::slice_of(const Tensor& full) const {
  LOOM_CHECK(full.defined() && full.shape() == full_shape, "ShardSpec: a full tensor of shape ",
             shape_str(full_shape), " is needed to take the shard ", str(), ", got ",
             full.defined() ? shape_str(full.shape()) : "undefined");
  NoGradGuard no_grad;
  return full.detach().contiguous().reshape(view_shape).narrow(dim, start, length).contiguous();
}

std::string ShardSpec::str() const {
  return detail::str_cat(shape_str(view_shape), " dim ", dim, " [", start, ", ", start + length,
                         ")");
}

}  // namespace loom::nn
