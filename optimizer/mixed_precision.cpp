#include "optimizer/mixed_precision.h"

#include "core/ops.h"
#include "optimizer/clip_grad.h"

namespace loom::optim {
namespace {

std::string master_key(size_t i) { return std::to_string(i) + ".master"; }

}  // namespace

MixedPrecisionOptimizer::MixedPrecisionOptimizer(std::vector<Tensor> params,
                                                 const OptimizerFactory& make_optimizer,
                                                 LossScaler scaler)
    : Optimizer("MixedPrecision", params, 0.0, /*f32_only=*/false),
      masters_(params),
      scaler_(scaler) {
  LOOM_CHECK(make_optimizer != nullptr, name_, ": no optimizer factory given");
  inner_ = make_optimizer(masters_.masters());
  LOOM_CHECK(inner_ != nullptr, name_, ": the optimizer factory returned null");
  lr_ = inner_->lr();
  name_ = inner_->name();
}

Tensor MixedPrecisionOptimizer::scale_loss(const Tensor& loss) const {
  return scaler_.scale() == 1.0 ? loss : scale(loss, scaler_.scale());
}

bool MixedPrecisionOptimizer::unscale_gradients() {
  std::vector<Tensor> grads;
  for (const Tensor& p : params_) grads.push_back(p.grad());
  found_nonfinite_ = !masters_.set_gradients(grads, 1.0 / scaler_.scale());
  if (any_rank_) found_nonfinite_ = any_rank_(found_nonfinite_);
  unscaled_ = true;
  return !found_nonfinite_;
}

double MixedPrecisionOptimizer::clip_grad_norm(double max_norm) {
  if (!unscaled_) unscale_gradients();
  return optim::clip_grad_norm(masters_.masters(), max_norm);
}

void MixedPrecisionOptimizer::step() {
  if (!unscaled_) unscale_gradients();
  unscaled_ = false;
  if (!found_nonfinite_) {
    inner_->set_lr(lr_);
    inner_->step();
    masters_.copy_to_model();
  }
  masters_.clear_gradients();
  scaler_.update(found_nonfinite_);
}

std::vector<std::pair<std::string, Tensor>> MixedPrecisionOptimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out = inner_->state();
  for (size_t i = 0; i < masters_.masters().size(); ++i)
    out.emplace_back(master_key(i), masters_.masters()[i]);
  return out;
}

std::map<std::string, Tensor> MixedPrecisionOptimizer::state_dict() const {
  std::map<std::string, Tensor> out = inner_->state_dict();
  for (size_t i = 0; i < masters_.masters().size(); ++i)
    out[master_key(i)] = masters_.masters()[i].clone();
  return out;
}

void MixedPrecisionOptimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  std::map<std::string, Tensor> inner;
  const std::vector<Tensor>& masters = masters_.masters();
  for (size_t i = 0; i < masters.size(); ++i) {
    auto it = state.find(master_key(i));
    LOOM_CHECK(it != state.end() && it->second.defined(), name_, ": load_state_dict: no '",
               master_key(i), "' (the f32 master of parameter ", i, ")");
    LOOM_CHECK(it->second.shape() == masters[i].shape() && it->second.dtype() == DType::kF32, name_,
               ": load_state_dict: '", master_key(i), "' is ", it->second.str(),
               " but the master is ", masters[i].str());
  }
  for (const auto& [key, t] : state)
    if (key.size() < 7 || key.compare(key.size() - 7, 7, ".master") != 0) inner.emplace(key, t);
  inner_->load_state_dict(inner);  // checks its own entries before changing anything
  for (size_t i = 0; i < masters.size(); ++i) {
    const Tensor& from = state.at(master_key(i));
    // The live master itself (a checkpoint load fills it in place): nothing to copy.
    if (from.device() == masters[i].device() && from.data_ptr() == masters[i].data_ptr() &&
        from.is_contiguous() && masters[i].is_contiguous())
      continue;
    Tensor(masters[i]).copy_(from);
  }
  masters_.copy_to_model();
}

}  // namespace loom::optim
