// Global-norm gradient clipping.
#include "optimizer/clip_grad.h"

#include <cmath>

#include <map>

#include "core/cuda_dispatch.h"
#include "core/ops.h"
#include "kernels/cuda/norm_reduce.h"  // no CUDA header; called only under LOOM_IF_CUDA

namespace loom::optim {

namespace {

// The f64 sum of squares of f32 gradients on one CUDA device: one multi-tensor reduction and one
// read back, where summing tensor by tensor would wait for the GPU once per parameter.
double cuda_sum_of_squares(Device device, const std::vector<Tensor>& grads) {
  std::vector<const float*> ptrs;
  std::vector<int64_t> sizes;
  for (const Tensor& g : grads) {
    ptrs.push_back(g.data<float>());
    sizes.push_back(g.numel());
  }
  double result = 0.0;
  LOOM_IF_CUDA({
    const size_t bytes =
        kernels::cuda::sum_of_squares_multi_workspace_bytes(sizes.data(), int64_t(sizes.size()));
    Tensor ws = cuda_workspace(device, bytes);
    Tensor out = cuda_workspace(device, sizeof(double));
    kernels::cuda::sum_of_squares_multi(ptrs.data(), sizes.data(), int64_t(sizes.size()),
                                        static_cast<double*>(out.data_ptr()), ws.data_ptr(), bytes,
                                        cuda_stream(device));
    out.copy_to_host(&result, sizeof(result));
  });
  return result;
}

}  // namespace

double grad_sum_of_squares(const std::vector<Tensor>& params) {
  double sum_sq = 0.0;
  std::map<int, std::vector<Tensor>> cuda_grads;  // f32 gradients by device
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    const Tensor& g = p.grad();
    if (g.device().is_cuda() && g.dtype() == DType::kF32)
      cuda_grads[g.device().index].push_back(g.detach().contiguous());
    else
      sum_sq += sum_of_squares(g);
  }
  for (const auto& [device, grads] : cuda_grads)
    sum_sq += cuda_sum_of_squares(Device::cuda(device), grads);
  return sum_sq;
}

void scale_grads_to_norm(const std::vector<Tensor>& params, double norm, double max_norm) {
  LOOM_CHECK(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double coef = max_norm / (norm + 1e-6);
  if (!std::isfinite(norm) || !(coef < 1.0)) return;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    if (!g.is_contiguous()) {
      g = g.detach().contiguous();
      const_cast<Tensor&>(p).set_grad(g);
    }
    scale_(g, coef);
  }
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  LOOM_CHECK(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double norm = std::sqrt(grad_sum_of_squares(params));
  scale_grads_to_norm(params, norm, max_norm);
  return norm;
}

}  // namespace loom::optim
