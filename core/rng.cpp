// Counter-based initialisation: see Note [Counter-based init] in core/rng.h.
#include "core/rng.h"

#include <vector>

#include "kernels/cpu/philox.h"

namespace loom::rng {

namespace {

enum class Dist { kNormal, kUniform };

// Fills t with the slice of the parameter described by `slice`. The slice is viewed as
// [outer, len, inner] inside the full [outer, full_len, inner]; element (o, l, i) of the slice
// is element (o * full_len + start + l) * inner + i of the full parameter.
void fill(Tensor& t, const Slice& slice, uint64_t seed, const std::string& name, Dist dist,
          double a, double b) {
  LOOM_CHECK(t.defined(), "rng::fill: tensor for '", name, "' is undefined");
  LOOM_CHECK(is_floating(t.dtype()), "rng::fill: parameter '", name, "' has dtype ",
             dtype_name(t.dtype()), ", expected a floating type");
  const Shape& full = slice.full_shape;
  const int64_t nd = int64_t(full.size());
  LOOM_CHECK(t.dim() == nd, "rng::fill: parameter '", name, "': tensor ", shape_str(t.shape()),
             " is not a slice of ", shape_str(full), " (rank differs)");
  int64_t dim = slice.dim;
  if (nd > 0) {
    LOOM_CHECK(dim >= -nd && dim < nd, "rng::fill: parameter '", name, "': slice dim ", dim,
               " out of range for ", shape_str(full));
    if (dim < 0) dim += nd;
  } else {
    dim = 0;
  }
  int64_t outer = 1, inner = 1, len = 1, full_len = 1;
  for (int64_t d = 0; d < nd; ++d) {
    if (d == dim) {
      len = t.size(d);
      full_len = full[size_t(d)];
      LOOM_CHECK(slice.start >= 0 && slice.start <= full_len && len <= full_len - slice.start,
                 "rng::fill: parameter '", name, "': a slice of ", len, " from ", slice.start,
                 " is outside dim ", d, " of size ", full_len);
      continue;
    }
    LOOM_CHECK(t.size(d) == full[size_t(d)], "rng::fill: parameter '", name, "': tensor ",
               shape_str(t.shape()), " is not a slice of ", shape_str(full), " along dim ", dim);
    (d < dim ? outer : inner) *= full[size_t(d)];
  }
  if (nd == 0) LOOM_CHECK(slice.start == 0, "rng::fill: a scalar has no slices");

  const uint64_t key = seed, stream = stream_of(name);
  const float fa = float(a), fb = float(b);
  std::vector<float> values(size_t(t.numel()));
  const int64_t rows = outer * len;
#pragma omp parallel for schedule(static) if (rows * inner > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r / len, l = r % len;
    const uint64_t base = uint64_t((o * full_len + slice.start + l) * inner);
    float* out = values.data() + r * inner;
    for (int64_t i = 0; i < inner; ++i) {
      philox::Block blk = philox::element_block(key, stream, base + uint64_t(i));
      out[i] = dist == Dist::kNormal ? fa + fb * philox::normal(blk.v[0], blk.v[1])
                                     : fa + (fb - fa) * philox::uniform01(blk.v[0]);
    }
  }
  Tensor host = Tensor::from_vector(values, t.shape());
  if (t.dtype() != DType::kF32) host = host.to(t.dtype());
  t.copy_(host);
}

Slice whole(const Tensor& t) {
  LOOM_CHECK(t.defined(), "rng::fill: tensor is undefined");
  return Slice{t.shape(), 0, 0};
}

}  // namespace

uint64_t stream_of(const std::string& name) { return philox::hash_name(name.c_str()); }

void fill_normal(Tensor& t, uint64_t seed, const std::string& name, double mean, double std) {
  fill(t, whole(t), seed, name, Dist::kNormal, mean, std);
}

void fill_uniform(Tensor& t, uint64_t seed, const std::string& name, double lo, double hi) {
  fill(t, whole(t), seed, name, Dist::kUniform, lo, hi);
}

void fill_normal(Tensor& t, const Slice& slice, uint64_t seed, const std::string& name, double mean,
                 double std) {
  fill(t, slice, seed, name, Dist::kNormal, mean, std);
}

void fill_uniform(Tensor& t, const Slice& slice, uint64_t seed, const std::string& name, double lo,
                  double hi) {
  fill(t, slice, seed, name, Dist::kUniform, lo, hi);
}

}  // namespace loom::rng
