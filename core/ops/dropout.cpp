// dropout keyed by (seed, stream, offset). The backward recomputes the mask from the key instead
// of saving one, so dropout costs no activation memory (See kernels/cpu/dropout.h).
#include "kernels/cpu/dropout.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"

namespace loom {
namespace {

// y = mask * x / (1 - p) over a contiguous x, with the element indices of See DropoutKey's parts.
void dropout_parts(const float* x, float* y, const Shape& shape, float p, const DropoutKey& key) {
  const int64_t n = shape_numel(shape);
  if (key.parts == 1) {
    kernels::cpu::dropout(x, y, n, p, key.seed, key.stream, key.offset);
    return;
  }
  // Runs of `inner` elements are contiguous in the whole tensor too.
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < key.part_dim; ++d) outer *= shape[size_t(d)];
  for (size_t d = size_t(key.part_dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t mid = shape[size_t(key.part_dim)], whole_mid = mid * key.parts;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t m = 0; m < mid; ++m) {
      const int64_t local = (o * mid + m) * inner;
      const int64_t whole = (o * whole_mid + key.part * mid + m) * inner;
      kernels::cpu::dropout(x + local, y + local, inner, p, key.seed, key.stream,
                            key.offset + uint64_t(whole));
    }
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, const DropoutKey& key) {
  detail::check_defined("dropout", "x", x);
  const detail::LowPrecision lp("dropout", {{"x", x}});  // x is f32, bf16 or f16
  LOOM_CHECK(p >= 0.0 && p < 1.0 && float(p) < 1.0f,
             "dropout: probability p must be in [0, 1), got ", p);
  if (!training || p == 0.0) return x;
  if (lp) return lp.round(dropout(lp.f32(x), p, training, key));  // Note [Low-precision compute]
  LOOM_CHECK(x.device().is_cpu(), "dropout: CUDA kernel not implemented yet (CPU only for now)");
  LOOM_CHECK(key.parts >= 1 && key.part >= 0 && key.part < key.parts && key.part_dim >= 0 &&
                 (key.parts == 1 || key.part_dim < x.dim()),
             "dropout: part ", key.part, " of ", key.parts, " along dim ", key.part_dim,
             " does not fit ", x.str());
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());
  const float pf = float(p);
  dropout_parts(in.data<float>(), out.data<float>(), in.shape(), pf, key);
  autograd::record(out, "dropout", {x}, [pf, key](const Tensor& g) {
    Tensor gc = g.contiguous();
    Tensor dx = Tensor::empty(gc.shape(), DType::kF32, gc.device());
    dropout_parts(gc.data<float>(), dx.data<float>(), gc.shape(), pf, key);
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom
