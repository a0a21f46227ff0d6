// The optimizer interface: a list of parameters, step() to update them from their gradients,
// zero_grad() to drop the gradients. Parameters without a gradient in a step are skipped (and
// their per-parameter step count does not advance, as in PyTorch). State tensors (momentum
// buffers, Adam moments) are exposed so memory can be counted and ZeRO can shard them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom::optim {

class Optimizer {
 public:
  Optimizer(const char* name, std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient.
  virtual void step() = 0;
  // Drops every parameter's gradient (undefined again).
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);  // a schedule calls this before step()
  const std::vector<Tensor>& params() const { return params_; }
  const char* name() const { return name_; }

  // Every state tensor, named "{param index}.{kind}" with PyTorch's kinds (momentum_buffer,
  // exp_avg, exp_avg_sq).
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  size_t state_bytes() const;  // sum of the state tensors' sizes

 protected:
  // The gradient of params_[i] as a contiguous tensor on the parameter's device, or undefined
  // when it has none this step. Checks shape, dtype and device against the parameter.
  Tensor grad_for_update(size_t i) const;
  // Raises "<name>: CUDA kernel not implemented yet" for parameters the CPU kernels cannot take.
  void require_cpu(const Tensor& param) const;

  const char* name_;
  std::vector<Tensor> params_;
  double lr_;
};

}  // namespace loom::optim
