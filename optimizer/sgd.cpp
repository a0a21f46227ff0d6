// SGD: checks and dispatch: per parameter to kernels/cpu/optimizer_update, and on CUDA one
// multi-tensor launch per group of parameters that share a device and first-step flag.
#include "optimizer/sgd.h"

#include <map>
#include <utility>

#include "core/cuda_dispatch.h"
#include "kernels/cpu/optimizer_update.h"
#include "kernels/cuda/optimizer_update.h"  // no CUDA header; called only under LOOM_IF_CUDA

namespace loom::optim {

SGD::SGD(std::vector<Tensor> params, const SgdOptions& options)
    : Optimizer("SGD", std::move(params), options.lr), options_(options) {
  LOOM_CHECK(options.momentum >= 0.0, "SGD: momentum must be >= 0, got ", options.momentum);
  LOOM_CHECK(options.weight_decay >= 0.0, "SGD: weight decay must be >= 0, got ",
             options.weight_decay);
  LOOM_CHECK(!options.nesterov || (options.momentum > 0.0 && options.dampening == 0.0),
             "SGD: nesterov needs momentum > 0 and dampening 0 (got momentum ", options.momentum,
             ", dampening ", options.dampening, ")");
  steps_.assign(params_.size(), 0);
  if (options.momentum != 0.0)
    for (const Tensor& p : params_)
      momentum_.push_back(Tensor::zeros(p.shape(), DType::kF32, p.device()));
}

void SGD::step() {
  // On CUDA: one multi-tensor launch per (device, first step or not) group.
  std::map<std::pair<int, bool>, std::vector<kernels::cuda::SgdTensor>> cuda_groups;
  std::vector<Tensor> grads_in_flight;  // contiguous copies stay alive until their launch
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = grad_for_update(i);
    if (!g.defined()) continue;
    Tensor& p = params_[i];
    require_f32(p);
    p.storage()->bump_version();  // the kernels below write p: See Note [Version counter]
    const kernels::cpu::SgdHyper h = hyper(steps_[i] == 0);
    float* buf = momentum_.empty() ? nullptr : momentum_[i].data<float>();
    ++steps_[i];
    if (p.device().is_cuda()) {
      cuda_groups[{p.device().index, h.first_step}].push_back(
          {p.data<float>(), g.data<float>(), buf, p.numel()});
      grads_in_flight.push_back(g);
      continue;
    }
    kernels::cpu::sgd_step(p.data<float>(), g.data<float>(), buf, p.numel(), h);
  }
  for (const auto& [key, tensors] : cuda_groups) {
    LOOM_IF_CUDA(kernels::cuda::sgd_step_multi(tensors.data(), int64_t(tensors.size()),
                                               hyper(key.second),
                                               cuda_stream(Device::cuda(key.first))));
  }
}

kernels::cpu::SgdHyper SGD::hyper(bool first_step) const {
  kernels::cpu::SgdHyper h;
  h.lr = lr_;
  h.momentum = options_.momentum;
  h.dampening = options_.dampening;
  h.weight_decay = options_.weight_decay;
  h.nesterov = options_.nesterov;
  h.first_step = first_step;
  return h;
}

std::vector<std::pair<std::string, Tensor>> SGD::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < momentum_.size(); ++i)
    out.emplace_back(std::to_string(i) + ".momentum_buffer", momentum_[i]);
  return out;
}

std::map<std::string, Tensor> SGD::state_dict() const { return state_dict_with_steps(steps_); }

void SGD::load_state_dict(const std::map<std::string, Tensor>& state) {
  load_state_dict_with_steps(state, steps_);
}

}  // namespace loom::optim
