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

// Records `backward` as the grad_fn of `output` when needs_grad(inputs). Call after computing
// the output. `backward` must not capture `output` itself (that would be a cycle): capture
// output.detach() where the backward needs the result.
void record(Tensor& output, const char* name, const std::vector<Tensor>& inputs,
            BackwardFn backward);

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
