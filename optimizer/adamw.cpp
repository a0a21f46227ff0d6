// AdamW: checks and dispatch: per parameter to kernels/cpu/optimizer_update, and on CUDA one
// multi-tensor launch per group of parameters that share a device and a step count.
#include "optimizer/adamw.h"

#include <map>
#include <utility>

#include "core/cuda_dispatch.h"
#include "kernels/cpu/optimizer_update.h"
#include "kernels/cuda/optimizer_update.h"  // no CUDA header; called only under LOOM_IF_CUDA

namespace loom::optim {

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer("AdamW", std::move(params), options.lr), options_(options) {
  LOOM_CHECK(options.beta1 >= 0.0 && options.beta1 < 1.0, "AdamW: beta1 must be in [0, 1), got ",
             options.beta1);
  LOOM_CHECK(options.beta2 >= 0.0 && options.beta2 < 1.0, "AdamW: beta2 must be in [0, 1), got ",
             options.beta2);
  LOOM_CHECK(options.eps >= 0.0, "AdamW: eps must be >= 0, got ", options.eps);
  LOOM_CHECK(options.weight_decay >= 0.0, "AdamW: weight decay must be >= 0, got ",
             options.weight_decay);
  steps_.assign(params_.size(), 0);
  for (const Tensor& p : params_) {
    exp_avg_.push_back(Tensor::zeros(p.shape(), DType::kF32, p.device()));
    exp_avg_sq_.push_back(Tensor::zeros(p.shape(), DType::kF32, p.device()));
  }
}

void AdamW::step() {
  std::map<std::pair<int, int64_t>, std::vector<kernels::cuda::AdamWTensor>> cuda_groups;
  std::vector<Tensor> grads_in_flight;  // contiguous copies stay alive until their launch
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = grad_for_update(i);
    if (!g.defined()) continue;
    Tensor& p = params_[i];
    require_f32(p);
    p.storage()->bump_version();  // the kernels below write p: See Note [Version counter]
    kernels::cpu::AdamWHyper h = hyper(++steps_[i]);
    if (p.device().is_cuda()) {
      cuda_groups[{p.device().index, h.step}].push_back({p.data<float>(), g.data<float>(),
                                                         exp_avg_[i].data<float>(),
                                                         exp_avg_sq_[i].data<float>(), p.numel()});
      grads_in_flight.push_back(g);
      continue;
    }
    kernels::cpu::adamw_step(p.data<float>(), g.data<float>(), exp_avg_[i].data<float>(),
                             exp_avg_sq_[i].data<float>(), p.numel(), h);
  }
  for (const auto& [key, tensors] : cuda_groups) {
    LOOM_IF_CUDA(kernels::cuda::adamw_step_multi(tensors.data(), int64_t(tensors.size()),
                                                 hyper(key.second),
                                                 cuda_stream(Device::cuda(key.first))));
  }
}

kernels::cpu::AdamWHyper AdamW::hyper(int64_t step) const {
  kernels::cpu::AdamWHyper h;
  h.lr = lr_;
  h.beta1 = options_.beta1;
  h.beta2 = options_.beta2;
  h.eps = options_.eps;
  h.weight_decay = options_.weight_decay;
  h.step = step;
  return h;
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(std::to_string(i) + ".exp_avg", exp_avg_[i]);
    out.emplace_back(std::to_string(i) + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

std::map<std::string, Tensor> AdamW::state_dict() const { return state_dict_with_steps(steps_); }

void AdamW::load_state_dict(const std::map<std::string, Tensor>& state) {
  load_state_dict_with_steps(state, steps_);
}

}  // namespace loom::optim
