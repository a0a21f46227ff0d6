// The optimizer interface: a list of parameters, step() to update them from their gradients,
// zero_grad() to drop the gradients. Parameters without a gradient in a step are skipped (and
// their per-parameter step count does not advance, as in PyTorch). State tensors (momentum
// buffers, Adam moments) are exposed so memory can be counted and ZeRO can shard them;
// state_dict() / load_state_dict() save and restore them, with the step counts, for a checkpoint.
//
// Note [Optimizer state dict]
// A state dict holds what the next step() reads besides the parameters, gradients and learning
// rate: the state() tensors and, as "{i}.step" (a 1-element i64 CPU tensor), how many updates
// parameter i has received. The count matters to SGD too: its first update sets the momentum
// buffer to the gradient instead of blending into it. The learning rate is left out: a schedule
// sets it before every step. state_dict() returns copies, so later steps leave a saved state
// as it was. load_state_dict() checks every key, dtype, shape and count before it changes
// anything, so a failed load leaves the optimizer as it was.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom::optim {

class Optimizer {
 public:
  // f32_only false: a wrapper whose parameters may be bf16 or f16 (it steps f32 masters).
  Optimizer(const char* name, std::vector<Tensor> params, double lr, bool f32_only = true);
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

  // Everything needed to resume bit-exactly: state() and the step counts, copied. See Note
  // [Optimizer state dict]. The default refuses: an optimizer opts in by overriding both
  // (usually with the *_with_steps helpers below).
  virtual std::map<std::string, Tensor> state_dict() const;
  // Copies a state_dict() of an optimizer of the same kind over parameters of the same shapes
  // into this one's state. Throws, changing nothing, on a missing or unexpected key, a dtype or
  // shape that differs from this optimizer's, or a step count that is not one value >= 0.
  virtual void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  // The gradient of params_[i] as a contiguous tensor on the parameter's device, or undefined
  // when it has none this step. Checks shape, dtype and device against the parameter.
  Tensor grad_for_update(size_t i) const;
  // Raises an error naming the parameter unless it is f32 (the update kernels' only dtype).
  void require_f32(const Tensor& param) const;
  // state_dict() and load_state_dict() for an optimizer whose state is state() plus `steps`, one
  // update count per parameter.
  std::map<std::string, Tensor> state_dict_with_steps(const std::vector<int64_t>& steps) const;
  void load_state_dict_with_steps(const std::map<std::string, Tensor>& state,
                                  std::vector<int64_t>& steps);

  const char* name_;
  std::vector<Tensor> params_;
  double lr_;
};

// A state dict key "{i}.{kind}" -> (i, kind) (See Note [Optimizer state dict]); false for any
// other key.
bool split_state_key(const std::string& key, size_t& index, std::string& kind);

// Builds an optimizer over the parameters it is given: how wrappers that own the tensors being
// stepped (f32 masters, ZeRO's shards) take "any loom optimizer".
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor> params)>;

}  // namespace loom::optim
