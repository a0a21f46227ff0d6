// Define-by-run autograd. Each op that produces a tensor from inputs needing gradients records a
// Node holding its backward; backward() walks the recorded graph from the outputs in reverse
// creation order. See Note [Gradient readiness] in autograd.cpp for when grad-ready hooks fire.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::autograd {

// Maps the gradient of an op's single output to the gradients of its inputs, one per input in
// the order given to record(); an undefined Tensor means "no gradient for this input".
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

class Node {
 public:
  explicit Node(std::string name);
  virtual ~Node() = default;
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;

  const std::string& name() const { return name_; }
  uint64_t sequence_nr() const { return sequence_nr_; }

  // One edge per input: where that input's gradient goes (null when it needs none), and the
  // input's shape and dtype, checked against what the backward returns.
  struct Edge {
    std::shared_ptr<Node> node;
    Shape shape;
    DType dtype;
  };
  std::vector<Edge> next;

 private:
  std::string name_;
  uint64_t sequence_nr_;
};

// True unless a NoGradGuard is active on this thread.
bool grad_enabled();

// Disables recording on this thread for its lifetime (nestable).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Re-enables recording inside a no-grad region (used by activation checkpointing).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// True if recording is on and any defined input requires a gradient.
bool needs_grad(const std::vector<Tensor>& inputs);

// A tensor an op keeps for its backward, with the storage it viewed and that storage's version
// when it was saved (See Note [Version counter] in core/tensor.h). check() raises a loom::Error
// naming the op and the tensor when the tensor was written in place (or re-pointed at other
// memory by set_data/to_) since: its backward would compute with values the forward never saw.
class SavedTensor {
 public:
  // `role`, for the error: which input of the op this is (its index), or kOutput, or kComputed
  // (a tensor the forward made: a contiguous copy, statistics).
  static constexpr int kOutput = -1;
  static constexpr int kComputed = -2;
  SavedTensor(const Tensor& tensor, int role);
  void check(const Node& node) const;

 private:
  Tensor tensor_;
  std::weak_ptr<Storage> storage_;  // identity only (never locked): set_data swaps storages
  uint64_t version_;
  int role_;
};

// Records `backward` as the grad_fn of `output` when needs_grad(inputs). Call after computing
// the output. `saved` lists every tensor whose values `backward` reads (captured inputs, their
// contiguous copies, the output, intermediates); each is checked against its version before
// `backward` runs, so an in-place change between forward and backward raises instead of giving
// wrong gradients. A tensor `backward` captures only for its shape, device or as a place to
// write (a fused optimizer's table) is not listed. `backward` must not capture `output` itself
// (that would be a cycle): capture output.detach() where the backward needs the result.
void record(Tensor& output, const char* name, const std::vector<Tensor>& inputs,
            const std::vector<Tensor>& saved, BackwardFn backward);

// Backpropagates from several outputs at once (a pipeline stage's backward): each output with a
// grad_fn (or a leaf requiring grad) receives the matching grad_output. Gradients accumulate
// (+=) into leaves' .grad(). The graph is freed as it is consumed.
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs);

// Activation checkpointing: runs fn(inputs) without recording, keeping only the inputs; in
// backward it runs fn again with recording on and backpropagates through that. fn must be
// deterministic (dropout in loom is counter-based, so it is). Parameters used inside fn get their
// gradients during the recomputation's backward.
Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                  const std::vector<Tensor>& inputs);

}  // namespace loom::autograd

namespace loom {
using autograd::NoGradGuard;
}
