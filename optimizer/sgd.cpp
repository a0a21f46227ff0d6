// SGD: checks and per-parameter dispatch to kernels/cpu/optimizer_update.
#include "optimizer/sgd.h"

#include "kernels/cpu/optimizer_update.h"

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
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = grad_for_update(i);
    if (!g.defined()) continue;
    Tensor& p = params_[i];
    require_cpu(p);
    kernels::cpu::SgdHyper h;
    h.lr = lr_;
    h.momentum = options_.momentum;
    h.dampening = options_.dampening;
    h.weight_decay = options_.weight_decay;
    h.nesterov = options_.nesterov;
    h.first_step = steps_[i] == 0;
    float* buf = momentum_.empty() ? nullptr : momentum_[i].data<float>();
    kernels::cpu::sgd_step(p.data<float>(), g.data<float>(), buf, p.numel(), h);
    ++steps_[i];
  }
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
