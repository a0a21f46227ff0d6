// Stochastic gradient descent with momentum and coupled weight decay, exactly as
// torch.optim.SGD: g = grad + wd * p; buf = momentum * buf + (1 - dampening) * g (buf = g the
// first time); d = nesterov ? g + momentum * buf : buf; p -= lr * d.
#pragma once

#include "kernels/cpu/optimizer_update.h"
#include "optimizer/optimizer.h"

namespace loom::optim {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // coupled (added to the gradient), as PyTorch SGD
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SgdOptions& options);
  void step() override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;
  const SgdOptions& options() const { return options_; }

 private:
  kernels::cpu::SgdHyper hyper(bool first_step) const;

  SgdOptions options_;
  std::vector<Tensor> momentum_;  // per parameter, its shape; empty when momentum == 0
  std::vector<int64_t> steps_;    // updates each parameter has received
};

}  // namespace loom::optim
