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

// Note [Gradients of parts]
// An op whose output is a part of its one input (narrow: split, chunk, x[:, a:b]) has a gradient
// that is zero outside that part. Returned by a BackwardFn it is a zero-filled whole per op, and
// backward() then adds the wholes: `q, k, v = qkv.split(C, dim=2)` cost three zero-fills and two
// additions of the whole [B, T, 3C] per layer, where one whole is enough (nanoGPT's model written
// for loom measured the difference against loom-gpt). Such an op records an AccumulateFn: it
// adds its part into the gradient the input has gathered so far (`sum`: undefined when nothing
// has arrived, and the function makes the whole; else contiguous and backward()'s alone, so it
// may be written in place). The sums are the ones adding zero-filled wholes gave, except that a
// -0 outside every part stays -0 where + 0 made it +0.
using AccumulateFn = std::function<void(const Tensor& grad_output, Tensor& sum)>;
void record_part(Tensor& output, const char* name, const Tensor& input, AccumulateFn accumulate);

// Note [In-place ops and views]
// An in-place op (t.add_(y), t.copy_(v), t[i] = v, zero_) ends in assign_in_place(t, value):
// value, computed out of place from t's current history, is written into t's memory, and when
// grad is on and t or value requires grad the write is recorded as PyTorch records it:
// - t is not a view: t's history becomes "t = value" (its old history is cut off where value
//   did not use it).
// - t is a view of a root R (t made from R by narrow, slice, transpose, view, reshape of a
//   contiguous tensor, or an identity view: mark_view): R's history becomes "R with t's places
//   replaced by value" (PyTorch's CopySlices): R's gradient reaches R's old history everywhere
//   but there, and value's history there. t's history becomes "t = those places of R".
// Every other view of R made before the write (its grad_fn built from R's old history) is now
// stale: R's history generation moved on, and the view rebuilds its grad_fn as "those places of
// R" the next time anything asks for it (requires_grad, grad_fn, is_leaf: what every op and
// record() read), as PyTorch regenerates a view's grad_fn. So a script may write into a tensor
// through any of its views, or write the tensor and read an old view, and the gradients are the
// single-graph ones.
// Refused, with a message, as PyTorch refuses them: an in-place write of a leaf that requires
// grad or of a view of one while grad is on (an optimizer step belongs under no_grad). An op
// that saved t's old values for its backward still raises at that backward (Note [Version
// counter]): the in-place op's callers compute value from a clone of t when value's own op would
// save t's memory (t.mul_(y)).
// A view holds its root weakly (a graph that saved a view of a tensor must not keep that tensor,
// and so its own history, alive: a cycle). A stale view whose root was freed cannot rebuild its
// history and says so when it is used with grad on; keep the tensor while its views are used.

// Writes `value` (t's shape; converted to t's dtype and device) into t's memory as an in-place
// op does, recording it when grad is on and t or value requires grad (See Note [In-place ops
// and views]). `op` names the user's op in errors.
void assign_in_place(Tensor& t, const Tensor& value, const char* op);

// Marks `view` (made by make_view from base's memory, its history recorded from base's) as a
// differentiable view of base's root. Called by the view ops.
void mark_view(Tensor& view, const Tensor& base);

// Rebuilds a stale view's history from its root's (See Note [In-place ops and views]); cheap
// when the view is current or not a view. Called by Tensor's autograd accessors.
void rebuild_view_history(const std::shared_ptr<TensorImpl>& view);
inline void refresh_view(const std::shared_ptr<TensorImpl>& impl) {
  if (impl->is_view && *impl->root_generation != impl->view_generation) rebuild_view_history(impl);
}

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
// Whether this thread is inside checkpoint's recomputation of a forward (in backward). A layer
// whose forward counts or decides something once per forward (MoE's routing statistics and its
// place in a split batch) replays the first forward's decision instead of making it again.
bool recomputing();

}  // namespace loom::autograd

namespace loom {
using autograd::NoGradGuard;
}
