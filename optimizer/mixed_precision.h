// MixedPrecisionOptimizer: trains a model whose parameters are bf16 or f16 with f32 master
// weights, wrapping any loom optimizer (which steps the masters). With DDP the gradients it reads
// are the group average, so an inf or nan on any rank reaches every rank and all skip together;
// ZeRO, whose ranks see only their shards, does this itself (See ZeroOptimizer). Where ranks hold
// gradients the others never see (expert parallelism: each rank's own experts), the caller
// passes set_skip_agreement a function that tells every rank whether any rank found one.
//
//   optim::MixedPrecisionOptimizer opt(model.parameters(), factory, optim::LossScaler());
//   Tensor loss = model.loss(x, y);
//   opt.scale_loss(loss).backward();  // f16: gradients of loss * scale
//   opt.clip_grad_norm(1.0);          // optional: on the unscaled f32 gradients
//   opt.step();                       // skipped (nothing changes) on a non-finite gradient
//   opt.zero_grad();
#pragma once

#include <functional>
#include <memory>

#include "optimizer/loss_scaler.h"
#include "optimizer/master_weights.h"
#include "optimizer/optimizer.h"

namespace loom::optim {

class MixedPrecisionOptimizer : public Optimizer {
 public:
  // `params`: the model's bf16 or f16 parameters.
  MixedPrecisionOptimizer(std::vector<Tensor> params, const OptimizerFactory& make_optimizer,
                          LossScaler scaler);

  // loss * the current scale (differentiable).
  Tensor scale_loss(const Tensor& loss) const;
  // Moves the parameters' gradients into the masters in f32, divided by the scale. Returns
  // false when one is inf or nan: the step will be skipped. step() calls it when you have not.
  bool unscale_gradients();
  // Clips the unscaled f32 gradients to a global norm; returns the norm before clipping (inf or
  // nan when the step will be skipped).
  double clip_grad_norm(double max_norm);
  // The f32 masters, in the parameters' order; their gradients are the unscaled ones once
  // unscale_gradients() ran (for a norm the caller sums over ranks itself).
  const std::vector<Tensor>& masters() const { return masters_.masters(); }
  // any_rank(found) -> whether any rank found an inf or nan: called by unscale_gradients() on
  // every rank, so every rank skips the same steps (a collective: every rank must unscale).
  void set_skip_agreement(std::function<bool(bool)> any_rank) { any_rank_ = std::move(any_rank); }
  // The wrapped optimizer's update of the masters, rounded into the parameters; or, after a
  // non-finite gradient, nothing at all (parameters and optimizer state unchanged) and the scale
  // backs off.
  void step() override;

  const LossScaler& scaler() const { return scaler_; }
  LossScaler& scaler() { return scaler_; }  // a checkpoint restores it
  Optimizer& inner() const { return *inner_; }
  // The wrapped optimizer's state and the f32 masters ("{i}.master"): the optimizer state of
  // ZeRO's accounting (12 bytes per parameter with Adam).
  std::vector<std::pair<std::string, Tensor>> state() const override;
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 private:
  MasterWeights masters_;
  std::unique_ptr<Optimizer> inner_;
  LossScaler scaler_;
  bool unscaled_ = false, found_nonfinite_ = false;
  std::function<bool(bool)> any_rank_;  // See set_skip_agreement
};

}  // namespace loom::optim
