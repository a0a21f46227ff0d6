// Shared optimizer plumbing: argument checks, gradient access, state accounting.
#include "optimizer/optimizer.h"

namespace loom::optim {

Optimizer::Optimizer(const char* name, std::vector<Tensor> params, double lr)
    : name_(name), params_(std::move(params)), lr_(lr) {
  LOOM_CHECK(lr >= 0.0, name_, ": learning rate must be >= 0, got ", lr);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    LOOM_CHECK(p.defined(), name_, ": parameter ", i, " is undefined");
    LOOM_CHECK(p.dtype() == DType::kF32, name_, ": parameter ", i, " ", p.str(),
               " must be f32 (optimizers update f32 parameters)");
    LOOM_CHECK(p.is_contiguous(), name_, ": parameter ", i, " ", p.str(), " is not contiguous");
    for (size_t j = 0; j < i; ++j)
      LOOM_CHECK(!params_[j].same_as(p), name_, ": parameter ", i, " is the same tensor as ", j,
                 " (each parameter may appear once)");
  }
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

void Optimizer::set_lr(double lr) {
  LOOM_CHECK(lr >= 0.0, name_, ": learning rate must be >= 0, got ", lr);
  lr_ = lr;
}

size_t Optimizer::state_bytes() const {
  size_t total = 0;
  for (const auto& [name, t] : state()) total += t.nbytes();
  return total;
}

Tensor Optimizer::grad_for_update(size_t i) const {
  const Tensor& p = params_[i];
  const Tensor& g = p.grad();
  if (!g.defined()) return Tensor();
  LOOM_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(), name_,
             ": gradient ", g.str(), " of parameter ", i, " does not match the parameter ",
             p.str());
  return g.detach().contiguous();
}

void Optimizer::require_cpu(const Tensor& param) const {
  LOOM_CHECK(param.device().is_cpu(), name_, ": CUDA kernel not implemented yet (parameter on ",
             param.device().str(), ")");
}

}  // namespace loom::optim
