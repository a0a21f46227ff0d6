// dropout keyed by (seed, stream, offset). The backward recomputes the mask from the key instead
// of saving one, so dropout costs no activation memory (See kernels/cpu/dropout.h).
#include "kernels/cpu/dropout.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"

namespace loom {

Tensor dropout(const Tensor& x, double p, bool training, const DropoutKey& key) {
  detail::check_defined("dropout", "x", x);
  const detail::LowPrecision lp("dropout", {{"x", x}});  // x is f32, bf16 or f16
  LOOM_CHECK(p >= 0.0 && p < 1.0 && float(p) < 1.0f,
             "dropout: probability p must be in [0, 1), got ", p);
  if (!training || p == 0.0) return x;
  if (lp) return lp.round(dropout(lp.f32(x), p, training, key));  // Note [Low-precision compute]
  LOOM_CHECK(x.device().is_cpu(), "dropout: CUDA kernel not implemented yet (CPU only for now)");
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());
  const float pf = float(p);
  kernels::cpu::dropout(in.data<float>(), out.data<float>(), in.numel(), pf, key.seed, key.stream,
                        key.offset);
  autograd::record(out, "dropout", {x}, [pf, key](const Tensor& g) {
    Tensor gc = g.contiguous();
    Tensor dx = Tensor::empty(gc.shape(), DType::kF32, gc.device());
    kernels::cpu::dropout(gc.data<float>(), dx.data<float>(), gc.numel(), pf, key.seed, key.stream,
                          key.offset);
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom
