// dropout keyed by (seed, stream, offset). The backward recomputes the mask from the key instead
// of saving one, so dropout costs no activation memory (See kernels/cpu/dropout.h).
#include <string>
#include <vector>

#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#include "kernels/cpu/dropout.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/dropout.h"
#endif

namespace loom {
namespace {

// y = mask * x / (1 - p) over a contiguous x, with the element indices of See DropoutKey's parts:
// each element takes the index of its place in the whole tensor, whose dim 0 is batch_parts times
// x's and whose part_dim is parts times x's.
// The kernel of `device` on n elements whose first takes counter `offset`. The CUDA mask is the
// CPU's bit for bit (kernels/cuda/dropout.h).
void dropout_run(Device device, const float* x, float* y, int64_t n, float p, const DropoutKey& key,
                 uint64_t offset) {
  if (device.is_cpu()) {
    kernels::cpu::dropout(x, y, n, p, key.seed, key.stream, offset);
  } else {
    LOOM_IF_CUDA(
        kernels::cuda::dropout(x, y, n, p, key.seed, key.stream, offset, cuda_stream(device)));
  }
}

void dropout_parts(Device device, const float* x, float* y, const Shape& shape, float p,
                   const DropoutKey& key) {
  const int64_t n = shape_numel(shape);
  if (key.parts == 1 && key.batch_parts == 1) {
    dropout_run(device, x, y, n, p, key, key.offset);
    return;
  }
  // Dims past the last split one are whole, so runs of `inner` elements are contiguous in the
  // whole tensor too.
  const size_t last = size_t(key.parts > 1 ? key.part_dim : 0);
  Shape whole = shape, first = Shape(shape.size(), 0);
  whole[0] *= key.batch_parts;
  first[0] = key.batch_part * shape[0];
  if (key.parts > 1) {
    whole[last] *= key.parts;
    first[last] = key.part * shape[last];
  }
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d <= last; ++d) outer *= shape[d];
  for (size_t d = last + 1; d < shape.size(); ++d) inner *= shape[d];
  std::vector<int64_t> index(last + 1, 0);  // x's index over dims [0, last], row-major
  for (int64_t o = 0; o < outer; ++o) {
    int64_t place = 0;
    for (size_t d = 0; d <= last; ++d) place = place * whole[d] + first[d] + index[d];
    // One launch per run on CUDA: split dropout (tp or batch parts) is not yet a single kernel.
    dropout_run(device, x + o * inner, y + o * inner, inner, p, key,
                key.offset + uint64_t(place * inner));
    for (size_t d = last + 1; d-- > 0;) {  // next index
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
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
  LOOM_CHECK(key.parts >= 1 && key.part >= 0 && key.part < key.parts && key.part_dim >= 0 &&
                 (key.parts == 1 || key.part_dim < x.dim()),
             "dropout: part ", key.part, " of ", key.parts, " along dim ", key.part_dim,
             " does not fit ", x.str());
  LOOM_CHECK(key.batch_parts >= 1 && key.batch_part >= 0 && key.batch_part < key.batch_parts &&
                 (key.batch_parts == 1 || (x.dim() >= 1 && (key.parts == 1 || key.part_dim > 0))),
             "dropout: batch part ", key.batch_part, " of ", key.batch_parts, " does not fit ",
             x.str(), key.parts > 1 ? " with its part along dim " : "",
             key.parts > 1 ? std::to_string(key.part_dim) : std::string());
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(in.shape(), DType::kF32, in.device());
  const float pf = float(p);
  dropout_parts(in.device(), in.data<float>(), out.data<float>(), in.shape(), pf, key);
  autograd::record(out, "dropout", {x}, [pf, key](const Tensor& g) {
    Tensor gc = g.contiguous();
    Tensor dx = Tensor::empty(gc.shape(), DType::kF32, gc.device());
    dropout_parts(gc.device(), gc.data<float>(), dx.data<float>(), gc.shape(), pf, key);
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom
