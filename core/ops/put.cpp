// put_: elements written at flat positions, the core of Python's t[mask] = v and t[index] = v.
#include <vector>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "kernels/cpu/copy.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/copy.h"
#endif

namespace loom {

void put_(Tensor& x, const Tensor& positions, const Tensor& values) {
  detail::check_defined("put_", "x", x);
  detail::check_defined("put_", "positions", positions);
  detail::check_defined("put_", "values", values);
  LOOM_CHECK(!(x.requires_grad() && autograd::grad_enabled()), "put_: ", x.str(),
             " requires grad, and in-place writes are not recorded by autograd; write inside "
             "no_grad");
  LOOM_CHECK(positions.dtype() == DType::kI64, "put_: positions must be i64, got ",
             dtype_name(positions.dtype()));
  LOOM_CHECK(values.numel() == positions.numel(), "put_: ", values.numel(), " values for ",
             positions.numel(), " positions");
  const int64_t n = positions.numel(), numel = x.numel();
  // Every position in range and written once: which of two writes would win is no answer.
  const Tensor host = positions.detach().contiguous().to(Device::cpu());
  const int64_t* p = host.data<int64_t>();
  std::vector<uint8_t> seen(static_cast<size_t>(numel), 0);
  for (int64_t i = 0; i < n; ++i) {
    LOOM_CHECK(p[i] >= 0 && p[i] < numel, "put_: position ", p[i], " (element ", i,
               ") is outside [0, ", numel, ")");
    LOOM_CHECK(!seen[size_t(p[i])], "put_: the place ", p[i], " of ", shape_str(x.shape()),
               " is written twice (elements of the index name it more than once); which write "
               "would win is undefined in PyTorch, and loom refuses it");
    seen[size_t(p[i])] = 1;
  }
  if (n == 0) return;
  Tensor out = x.detach().clone();
  const Tensor src = values.detach().to(x.dtype()).to(x.device()).contiguous();
  const Tensor pos = positions.detach().to(x.device()).contiguous();
  const size_t elem = dtype_size(x.dtype());
  if (x.device().is_cpu()) {
    kernels::cpu::put_elements(src.data_ptr(), out.data_ptr(), elem, pos.data<int64_t>(), n);
  } else {
    LOOM_IF_CUDA(kernels::cuda::put_elements(src.data_ptr(), out.data_ptr(), elem,
                                             pos.data<int64_t>(), n, cuda_stream(x.device())));
  }
  x.copy_(out);
}

}  // namespace loom
