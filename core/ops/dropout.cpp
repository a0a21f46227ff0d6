// dropout keyed by (seed, stream, offset). The backward recomputes the mask from the key instead
// of saving one, so dropout costs no activation memory (See kernels/cpu/dropout.h).
#include <string>
#include <type_traits>
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

// The kernel of `device` on n elements whose first takes counter `offset`. The CUDA mask is the
// CPU's bit for bit (kernels/cuda/dropout.h). T is float, or BFloat16 on CUDA (Note [bf16 kernels
// on CUDA]).
template <typename T>
void dropout_run(Device device, const T* x, T* y, int64_t n, float p, const DropoutKey& key,
                 uint64_t offset) {
  if (device.is_cuda()) {
    LOOM_IF_CUDA(
        kernels::cuda::dropout(x, y, n, p, key.seed, key.stream, offset, cuda_stream(device)));
  } else if constexpr (std::is_same_v<T, float>) {
    kernels::cpu::dropout(x, y, n, p, key.seed, key.stream, offset);
  } else {
    LOOM_FAIL("dropout: bf16 kernels run on CUDA only");
  }
}

// y = mask * x / (1 - p) over a contiguous x, with the element indices of See DropoutKey's parts:
// each element takes the index of its place in the whole tensor, whose dim 0 is batch_parts times
// x's and whose part_dim is parts times x's.
template <typename T>
void dropout_parts(Device device, const T* x, T* y, const Shape& shape, float p,
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
  const bool bf16 = lp && cuda_bf16_path(x);  // Note [bf16 kernels on CUDA]
  if (lp && !bf16)
    return lp.round(dropout(lp.f32(x), p, training, key));  // Note [Low-precision compute]
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
  const DType dtype = bf16 ? DType::kBF16 : DType::kF32;
  Tensor out = Tensor::empty(in.shape(), dtype, in.device());
  const float pf = float(p);
  auto run = [pf, key](const Tensor& from, Tensor& to) {
    if (to.dtype() == DType::kBF16)
      dropout_parts(to.device(), from.data<BFloat16>(), to.data<BFloat16>(), to.shape(), pf, key);
    else
      dropout_parts(to.device(), from.data<float>(), to.data<float>(), to.shape(), pf, key);
  };
  run(in, out);
  autograd::record(out, "dropout", {x}, {}, [run, dtype](const Tensor& g) {
    Tensor gc = g.to(dtype).contiguous();
    Tensor dx = Tensor::empty(gc.shape(), dtype, gc.device());
    run(gc, dx);
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom
