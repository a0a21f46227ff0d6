#include "core/autograd.h"

#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/ops.h"
#include "core/progress.h"

namespace loom::autograd {

// Note [Gradient readiness]
// Every leaf that requires a gradient has exactly one AccumulateGrad node (cached weakly on the
// leaf), and the engine runs a node only after every edge into it has delivered its gradient
// (dependency counting). So a leaf's AccumulateGrad runs once per backward, with the complete
// gradient, and that is when its grad-ready hooks fire: DDP launches a bucket's allreduce from
// there while the rest of backward goes on. Ready AccumulateGrad nodes run before anything
// else so hooks fire as early as possible; other nodes run in reverse creation order.
// A parameter used both inside and outside an activation-checkpointed region gets two
// backwards (the recomputation's and the outer one), and so fires its hooks twice.

namespace {

std::atomic<uint64_t> next_sequence_nr{0};
thread_local bool grad_mode = true;
thread_local int recompute_depth = 0;  // See recomputing()
// Inside checkpoint()'s first, unrecorded forward: its ops still give the progress hook its turn.
thread_local int checkpointed_forward_depth = 0;

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn, std::vector<SavedTensor> saved)
      : Node(name), fn_(std::move(fn)), saved_(std::move(saved)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    LOOM_CHECK(fn_ != nullptr, "backward: trying to backward through ", name(),
               " a second time; its saved tensors were freed by the first backward");
    for (const SavedTensor& s : saved_) s.check(*this);
    std::vector<Tensor> grads = fn_(grad_output);
    fn_ = nullptr;  // release saved tensors now: activations are freed as backward proceeds
    saved_.clear();
    return grads;
  }

 private:
  BackwardFn fn_;
  std::vector<SavedTensor> saved_;
};

// An op recorded by record_part: See Note [Gradients of parts] in autograd.h. backward() calls
// accumulate(); apply() is the same gradient as a whole of its own.
class PartNode final : public Node {
 public:
  PartNode(const char* name, AccumulateFn fn) : Node(name), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    Tensor whole;
    fn_(grad_output, whole);
    return {whole};
  }
  void accumulate(const Tensor& grad_output, Tensor& sum) { fn_(grad_output, sum); }

 private:
  AccumulateFn fn_;
};

// Makes `sum` safe to write in place: contiguous, and held by nothing but backward()'s slot (not
// a gradient another slot or the caller also holds, nor a view of one).
void make_exclusive(Tensor& sum) {
  if (!sum.defined()) return;
  if (sum.impl().use_count() == 1 && sum.storage().use_count() == 1 && sum.is_contiguous()) return;
  sum = sum.clone();
}

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf)
      : Node("AccumulateGrad"), leaf_(leaf) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    std::shared_ptr<TensorImpl> impl = leaf_.lock();
    if (!impl) return {};
    Tensor leaf(impl);
    Tensor g = grad_output.detach();
    if (!impl->grad.defined()) {
      // A private copy: the incoming gradient may alias another leaf's (add's backward hands
      // the same tensor to both inputs) and leaf gradients are later updated in place.
      impl->grad = g.clone();
    } else {
      add_(impl->grad, g);
    }
    for (auto& hook : impl->grad_ready_hooks) hook(leaf);
    return {};
  }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

std::shared_ptr<Node> accumulator_for(const Tensor& leaf) {
  const auto& impl = leaf.impl();
  std::shared_ptr<Node> acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(impl);
    impl->grad_accumulator = acc;
  }
  return acc;
}

// Where the gradient of `t` must be sent: its grad_fn, its accumulator, or nowhere.
std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  if (!t.defined()) return nullptr;
  if (t.grad_fn()) return t.grad_fn();
  if (t.requires_grad()) return accumulator_for(t);
  return nullptr;
}

bool is_accumulator(const Node* n) { return dynamic_cast<const AccumulateGrad*>(n) != nullptr; }

// Which of the op's tensors `t` is, for SavedTensor's error: an input or the output when it
// views the same storage, else a tensor the forward computed.
int saved_role(const Tensor& t, const Tensor& output, const std::vector<Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].storage() == t.storage()) return int(i);
  return output.storage() == t.storage() ? SavedTensor::kOutput : SavedTensor::kComputed;
}

}  // namespace

Node::Node(std::string name) : name_(std::move(name)), sequence_nr_(next_sequence_nr++) {}

bool grad_enabled() { return grad_mode; }

NoGradGuard::NoGradGuard() : previous_(grad_mode) { grad_mode = false; }
NoGradGuard::~NoGradGuard() { grad_mode = previous_; }
EnableGradGuard::EnableGradGuard() : previous_(grad_mode) { grad_mode = true; }
EnableGradGuard::~EnableGradGuard() { grad_mode = previous_; }

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_mode) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

SavedTensor::SavedTensor(const Tensor& tensor, int role)
    : tensor_(tensor),
      storage_(tensor.storage()),
      version_(tensor.storage()->version()),
      role_(role) {}

void SavedTensor::check(const Node& node) const {
  // Cheap on the normal path: a pointer and an integer compare (owner_before reads no counts).
  const std::shared_ptr<Storage>& now = tensor_.storage();
  const bool same_storage = !storage_.owner_before(now) && !now.owner_before(storage_);
  if (same_storage && now->version() == version_) return;
  const std::string role = role_ >= 0         ? "input " + std::to_string(role_)
                           : role_ == kOutput ? std::string("the output")
                                              : std::string("a tensor computed by the forward");
  LOOM_FAIL("backward of ", node.name(), ": ", role, " of ", node.name(), " (", tensor_.str(),
            "), saved for backward, ",
            same_storage ? "was modified by an in-place operation after the forward saved it "
                           "(version " +
                               std::to_string(version_) + " then, " +
                               std::to_string(now->version()) + " now)"
                         : "was given other memory (set_data or to_) after the forward saved it",
            "; its gradient would use values the forward never saw. Hint: use clone() on the "
            "tensor before the in-place change, or move the in-place change (an optimizer step, "
            "copy_, fill_, +=) after backward");
}

void record(Tensor& output, const char* name, const std::vector<Tensor>& inputs,
            const std::vector<Tensor>& saved, BackwardFn backward) {
  // See Note [Progress during compute] (progress.cpp). A checkpointed block's first forward
  // records nothing, yet is as long as the recomputation that does: its ops run the hook too.
  if (!needs_grad(inputs)) {
    if (checkpointed_forward_depth > 0) progress_during_compute();
    return;
  }
  progress_during_compute();
  std::vector<SavedTensor> saved_tensors;
  saved_tensors.reserve(saved.size());
  for (const Tensor& t : saved)
    if (t.defined()) saved_tensors.emplace_back(t, saved_role(t, output, inputs));
  auto node = std::make_shared<FunctionNode>(name, std::move(backward), std::move(saved_tensors));
  node->next.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    if (t.defined())
      node->next.push_back({gradient_edge(t), t.shape(), t.dtype()});
    else
      node->next.push_back({nullptr, {}, DType::kF32});
  }
  // The output is a fresh tensor from the op; give it its own impl's autograd state.
  output.impl()->grad_fn = std::move(node);
  output.impl()->requires_grad = true;
}

void record_part(Tensor& output, const char* name, const Tensor& input, AccumulateFn accumulate) {
  if (!needs_grad({input})) return;
  auto node = std::make_shared<PartNode>(name, std::move(accumulate));
  node->next.push_back({gradient_edge(input), input.shape(), input.dtype()});
  output.impl()->grad_fn = std::move(node);
  output.impl()->requires_grad = true;
}

// ---------------------------------------------------------------- in-place ops and views
// See Note [In-place ops and views] in autograd.h.

namespace {

// Where a view's elements lie in its root: the view's shape and strides, and its first
// element's distance from the root's first, in elements. The root is contiguous, so the same
// numbers find those elements in any contiguous tensor of the root's shape (its gradient).
struct Places {
  Shape shape;
  Shape strides;
  int64_t offset = 0;
};

Places places_in_root(const Tensor& view, const Tensor& root, const char* op) {
  LOOM_CHECK(view.storage() == root.storage(), op, ": ", view.str(),
             " no longer shares memory with the tensor it is a view of (set_data or to_ gave one "
             "of them other memory), so a write through it cannot be recorded by autograd");
  LOOM_CHECK(root.is_contiguous(), op, ": ", view.str(), " is a view of ", root.str(),
             ", which is not contiguous, so a write through the view cannot be recorded by "
             "autograd; write into a contiguous() copy instead");
  return {view.shape(), view.strides(), view.offset() - root.offset()};
}

// The elements of `whole` (contiguous, the root's shape) at `p`, as a view of it.
Tensor places_of(const Tensor& whole, const Places& p) {
  return make_view(whole, p.shape, p.strides, whole.offset() + p.offset);
}

// A root's shared count of history rebases, made when its first view is.
const std::shared_ptr<uint64_t>& generation_of(TensorImpl& root) {
  if (!root.root_generation) root.root_generation = std::make_shared<uint64_t>(0);
  return root.root_generation;
}

// The root whose memory `impl` views: itself for a root. A view whose root was freed becomes a
// root itself (nothing else can see its writes through the root any more).
std::shared_ptr<TensorImpl> root_of(const std::shared_ptr<TensorImpl>& impl) {
  if (!impl->is_view) return impl;
  if (std::shared_ptr<TensorImpl> root = impl->view_base.lock()) return root;
  impl->is_view = false;
  impl->view_base.reset();
  impl->root_generation = nullptr;
  return impl;
}

}  // namespace

void mark_view(Tensor& view, const Tensor& base) {
  const std::shared_ptr<TensorImpl> root = root_of(base.impl());
  if (root == view.impl()) return;  // an op that returned its input
  view.impl()->is_view = true;
  view.impl()->view_base = root;
  view.impl()->root_generation = generation_of(*root);
  view.impl()->view_generation = *view.impl()->root_generation;
}

void rebuild_view_history(const std::shared_ptr<TensorImpl>& impl) {
  impl->view_generation = *impl->root_generation;  // first: the reads below see it current
  const std::shared_ptr<TensorImpl> root_impl = impl->view_base.lock();
  Tensor view(impl);
  LOOM_CHECK(root_impl != nullptr, "autograd: ", view.str(),
             " is a view of a tensor that was written in place after the view was made and has "
             "since been freed, so the view's history cannot be rebuilt from it; keep the tensor "
             "(a variable) while its views are used, or clone() the view before the write");
  impl->grad_fn = nullptr;
  impl->requires_grad = false;
  const Tensor root(root_impl);
  if (!root.requires_grad()) return;
  // The view's history is its root's, whatever the grad mode is now: it is read later.
  EnableGradGuard recording;
  const Places p = places_in_root(view, root,
                                  "autograd (a view read after its tensor was "
                                  "written in place)");
  const Shape whole = root.shape();
  record(view, "view_of_written", {root}, {}, [p, whole](const Tensor& g) {
    Tensor grad = Tensor::zeros(whole, g.dtype(), g.device());
    places_of(grad, p).copy_(g.detach());
    return std::vector<Tensor>{grad};
  });
}

void assign_in_place(Tensor& t, const Tensor& value, const char* op) {
  LOOM_CHECK(t.defined(), op, ": the tensor written is undefined");
  LOOM_CHECK(value.defined(), op, ": the value written is undefined");
  LOOM_CHECK(value.shape() == t.shape(), op, ": a value of shape ", shape_str(value.shape()),
             " cannot be written into ", t.str());
  const bool recorded =
      grad_mode && is_floating(t.dtype()) && (t.requires_grad() || value.requires_grad());
  Tensor v = recorded ? value : value.detach();
  if (v.dtype() != t.dtype()) v = v.to(t.dtype());
  if (v.device() != t.device()) v = v.to(t.device());
  // The bytes to write, never overlapping t's own (a value that views t's memory, as
  // t.copy_(t.flip(0)) would, is copied out first).
  Tensor bytes = v.detach();
  if (bytes.storage() == t.storage()) bytes = bytes.clone();
  if (!recorded) {
    t.copy_(bytes);
    return;
  }
  LOOM_CHECK(!(t.is_leaf() && t.requires_grad()), op, ": ", t.str(),
             " is a leaf that requires grad, and autograd cannot record an in-place write of it "
             "(its gradient is the one backward accumulates); write it inside `with "
             "loom.no_grad():` (as an optimizer step does), or write a clone()");
  const std::shared_ptr<TensorImpl> root_impl = root_of(t.impl());
  if (root_impl == t.impl()) {
    // t = value: t's old history gets no gradient from here on (zeros, as PyTorch gives).
    Tensor old(std::make_shared<TensorImpl>(*t.impl()));  // t's history before the write
    old.impl()->root_generation = nullptr;
    const Shape shape = t.shape();
    const bool old_needs_grad = old.requires_grad();
    t.copy_(bytes);
    record(t, op, {old, v}, {}, [shape, old_needs_grad](const Tensor& g) {
      Tensor zeros = old_needs_grad ? Tensor::zeros(shape, g.dtype(), g.device()) : Tensor();
      return std::vector<Tensor>{zeros, g};
    });
    if (t.impl()->root_generation) ++*t.impl()->root_generation;  // its views rebuild
    return;
  }
  Tensor root(root_impl);
  LOOM_CHECK(!(root.is_leaf() && root.requires_grad()), op, ": ", t.str(), " is a view of ",
             root.str(),
             ", a leaf that requires grad, and autograd cannot record an in-place "
             "write of it; write it inside `with loom.no_grad():`, or write a clone()");
  const Places p = places_in_root(t, root, op);
  Tensor old(std::make_shared<TensorImpl>(*root_impl));  // the root's history before the write
  t.copy_(bytes);
  record(root, op, {old, v}, {}, [p](const Tensor& g) {
    const Tensor gc = g.detach().contiguous();
    Tensor rest = gc.clone();
    places_of(rest, p).fill_(0.0);
    return std::vector<Tensor>{rest, places_of(gc, p).contiguous()};
  });
  ++*generation_of(*root_impl);  // t and every other view of the root rebuild from it
}

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs) {
  LOOM_CHECK(outputs.size() == grad_outputs.size(), "backward: ", outputs.size(), " outputs but ",
             grad_outputs.size(), " gradients");
  std::unordered_map<Node*, Tensor> pending;  // summed incoming gradient per node
  std::vector<std::shared_ptr<Node>> roots;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    const Tensor& g = grad_outputs[i];
    LOOM_CHECK(out.defined(), "backward: output ", i, " is undefined");
    LOOM_CHECK(g.defined(), "backward: gradient for output ", i, " is undefined");
    LOOM_CHECK(g.shape() == out.shape(), "backward: gradient ", i, " has shape ",
               shape_str(g.shape()), " but output has ", shape_str(out.shape()));
    LOOM_CHECK(g.device() == out.device(), "backward: gradient ", i, " is on ", g.device().str(),
               " but output on ", out.device().str());
    std::shared_ptr<Node> root = gradient_edge(out);
    LOOM_CHECK(root != nullptr, "backward: output ", i, " (", out.str(),
               ") does not require grad: nothing that produced it requires a gradient");
    Tensor& slot = pending[root.get()];
    slot = slot.defined() ? add(slot, g.detach()) : g.detach();
    roots.push_back(root);
  }

  // Count, for every reachable node, how many edges lead into it.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (auto& r : roots)
    if (seen.insert(r.get()).second) stack.push_back(r.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->next) {
      if (!e.node) continue;
      ++dependencies[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }

  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    bool acc_a = is_accumulator(a.get()), acc_b = is_accumulator(b.get());
    if (acc_a != acc_b) return acc_b;  // accumulators first
    return a->sequence_nr() < b->sequence_nr();
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>,
                      decltype(later_first)>
      ready(later_first);
  std::unordered_set<Node*> queued;
  for (auto& r : roots)
    if (dependencies[r.get()] == 0 && queued.insert(r.get()).second) ready.push(r);

  NoGradGuard no_grad;
  while (!ready.empty()) {
    progress_during_compute();  // See Note [Progress during compute] (progress.cpp)
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    Tensor grad = std::move(pending[node.get()]);
    pending.erase(node.get());
    std::vector<Tensor> input_grads;
    auto* part = dynamic_cast<PartNode*>(node.get());
    if (grad.defined() && part != nullptr && node->next[0].node) {
      const Node::Edge& e = node->next[0];
      Tensor& slot = pending[e.node.get()];  // See Note [Gradients of parts]
      make_exclusive(slot);
      part->accumulate(grad, slot);
      LOOM_ASSERT(slot.shape() == e.shape && slot.dtype() == e.dtype, node->name(), " gathered a ",
                  dtype_name(slot.dtype()), " gradient of shape ", shape_str(slot.shape()),
                  ", expected ", dtype_name(e.dtype), " ", shape_str(e.shape));
    } else if (grad.defined()) {
      input_grads = node->apply(grad);
    }
    LOOM_ASSERT(input_grads.empty() || input_grads.size() == node->next.size(), node->name(),
                " returned ", input_grads.size(), " gradients for ", node->next.size(), " inputs");
    for (size_t i = 0; i < node->next.size(); ++i) {
      const Node::Edge& e = node->next[i];
      if (!e.node) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        const Tensor& gi = input_grads[i];
        LOOM_ASSERT(gi.shape() == e.shape, node->name(), " gave input ", i, " a gradient of shape ",
                    shape_str(gi.shape()), ", expected ", shape_str(e.shape));
        LOOM_ASSERT(gi.dtype() == e.dtype, node->name(), " gave input ", i, " a ",
                    dtype_name(gi.dtype()), " gradient, expected ", dtype_name(e.dtype));
        Tensor& slot = pending[e.node.get()];
        slot = slot.defined() ? add(slot, gi) : gi;
      }
      if (--dependencies[e.node.get()] == 0 && queued.insert(e.node.get()).second)
        ready.push(e.node);
    }
  }
}

bool recomputing() { return recompute_depth > 0; }

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                  const std::vector<Tensor>& inputs) {
  if (!needs_grad(inputs)) {
    // Parameters inside fn may still need gradients; without a tracked input we cannot know, so
    // run fn normally (recording whatever it records).
    return fn(inputs);
  }
  Tensor out;
  {
    NoGradGuard no_grad;
    struct CheckpointedForward {  // even if fn throws
      CheckpointedForward() { ++checkpointed_forward_depth; }
      ~CheckpointedForward() { --checkpointed_forward_depth; }
    } forward;
    out = fn(inputs);
  }
  out = out.detach();
  std::vector<Tensor> saved = inputs;
  // The recomputation reads the inputs, so an in-place change to one would recompute a different
  // forward: saved (and checked) like any op's.
  record(out, "checkpoint", inputs, saved, [fn, saved](const Tensor& g) {
    std::vector<Tensor> fresh;
    fresh.reserve(saved.size());
    for (const Tensor& t : saved) {
      if (!t.defined()) {
        fresh.push_back(t);
        continue;
      }
      Tensor d = t.detach();
      if (t.requires_grad()) d.set_requires_grad(true);
      fresh.push_back(d);
    }
    Tensor recomputed;
    {
      EnableGradGuard enable;
      struct Recomputing {  // recomputing() while fn runs again, even if it throws
        Recomputing() { ++recompute_depth; }
        ~Recomputing() { --recompute_depth; }
      } recomputing;
      recomputed = fn(fresh);
    }
    if (recomputed.grad_fn() || recomputed.requires_grad()) backward({recomputed}, {g});
    std::vector<Tensor> grads;
    for (const Tensor& t : fresh) grads.push_back(t.defined() ? t.grad() : Tensor());
    return grads;
  });
  return out;
}

}  // namespace loom::autograd
