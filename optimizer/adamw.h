// AdamW (Loshchilov & Hutter), exactly torch.optim.AdamW's update (amsgrad off):
//   p *= 1 - lr * wd                          (decoupled weight decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// with t the number of updates this parameter has received, counting this one.
#pragma once

#include "kernels/cpu/optimizer_update.h"
#include "optimizer/optimizer.h"

namespace loom::optim {

struct AdamWOptions {  // PyTorch's defaults
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options);
  void step() override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;
  const AdamWOptions& options() const { return options_; }
  int64_t step_count(size_t param_index) const { return steps_.at(param_index); }

 private:
  kernels::cpu::AdamWHyper hyper(int64_t step) const;

  AdamWOptions options_;
  std::vector<Tensor> exp_avg_;     // m, per parameter, its shape
  std::vector<Tensor> exp_avg_sq_;  // v, per parameter, its shape
  std::vector<int64_t> steps_;      // t, per parameter
};

}  // namespace loom::optim
