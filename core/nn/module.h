// Module: a node in a tree of layers owning parameters under hierarchical names
// ("blocks.3.attn.qkv.weight"). Parameters and children are kept in registration order, which is
// the order of named_parameters() (so a GPT lists its parameters as in Note [GPT parameter
// names]). Each parameter carries an Init spec; init_parameters(seed) fills every parameter by
// its full name, See Note [Deterministic init].
//
// The virtual surface is one call, forward(x), so Python can subclass modules through a
// pybind11 trampoline. Everything else is plain, non-virtual bookkeeping.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/nn/init.h"
#include "core/tensor.h"

namespace loom::nn {

using StateDict = std::map<std::string, Tensor>;

// What a non-strict load_state_dict left out: parameters the map lacked, and keys of the map
// the module does not have.
struct LoadResult {
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. The base raises "Module '<name>' has no forward(x)".
  virtual Tensor forward(const Tensor& x);

  // Runs forward(x) between this module's hooks: every forward pre-hook, forward(x), then every
  // forward hook, each of which may replace the output. Parents call their children this way
  // (as in PyTorch, `module(x)`), so a wrapper can act around any module's computation: ZeRO-3
  // gathers a module's parameters before it and frees them after. forward(x) skips the hooks.
  Tensor operator()(const Tensor& x);
  // The two halves of operator(), for a caller whose forward is not forward(x): a module written
  // in Python runs its forward(*args) between them.
  void run_forward_pre_hooks();
  Tensor run_forward_hooks(const Tensor& output);
  bool has_forward_hooks() const { return !pre_hooks_.empty() || !post_hooks_.empty(); }

  using ForwardPreHook = std::function<void(Module& module)>;
  using ForwardHook = std::function<Tensor(Module& module, const Tensor& output)>;
  // Hooks run in the order they were added; each returns a handle for remove_hook.
  int add_forward_pre_hook(ForwardPreHook hook);
  int add_forward_hook(ForwardHook hook);
  void remove_hook(int handle);  // unknown handles are ignored

  // ---- parameters (names relative to this module, registration order, depth first) ----
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;  // elements
  // The Init spec a parameter was registered with (name relative to this module).
  const Init& parameter_init(const std::string& name) const;
  // Where a parameter sits in its single-process parameter (tensor parallelism), or null for a
  // whole parameter (name relative to this module).
  const ShardSpec* parameter_shard(const std::string& name) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }

  // name -> parameter; the tensors share storage with the module's.
  StateDict state_dict() const;
  // Copies values into the existing parameters (their storage and autograd identity stay).
  // Shapes must match (an error names the key and both shapes); dtypes are converted between
  // floating types. strict: missing or unexpected keys are an error listing them all; otherwise
  // they are returned. Nothing is copied when an error is raised.
  LoadResult load_state_dict(const StateDict& state, bool strict = true);

  // ---- modes and gradients (recursive) ----
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();

  // Fills every parameter from its Init spec under `seed`, keyed by its full name.
  void init_parameters(uint64_t seed);

  // Converts every parameter (recursively) to floating `dtype` (f32, bf16 or f16; anything else
  // is an error and changes nothing). Each parameter stays the same tensor (Tensor::to_): a leaf,
  // still requiring grad, with its hooks, so handles taken before (parameters(), state_dict())
  // see the new dtype. Every gradient is dropped. The ops then run in bf16/f16, See Note
  // [Low-precision compute]. Call it before handing the parameters to an optimizer, DDP or ZeRO,
  // which keep their own views of the parameters' memory:
  //   nn::GPT model(config); model.init_parameters(seed); model.to(DType::kBF16);
  void to(DType dtype);
  // Moves every parameter (recursively) to `device` the same way (Tensor::to_(Device)): same
  // tensors, gradients dropped; call it before building optimizers, DDP or ZeRO. Buffers that
  // are not parameters (none in loom's built-in modules) are not moved.
  //   nn::GPT model(config); model.init_parameters(seed); model.to(Device::cuda(0));
  void to(Device device);

  // This module's name from the root of its tree: "" for a root, "blocks.3.attn" for a GPT's
  // fourth attention. Set by register_module; a root may be given one (a pipeline stage's block
  // keeps its global name) and its subtree follows.
  const std::string& full_name() const { return full_name_; }
  void set_full_name(const std::string& name);

  // Weight tying (PyTorch's `module.weight = other.weight`): this module's own parameter `name`
  // (no dots) becomes `tensor`, a leaf of the same shape, dtype and device, shared with whoever
  // else holds it; init_parameters leaves it to its first owner. named_parameters() lists a
  // shared tensor once, under its first name. Only modules whose forward reads the parameter
  // through a member they can re-point (Linear, Embedding, LayerNorm: parameter_tied) accept
  // it; the others refuse with an error naming the module.
  void tie_parameter(const std::string& name, const Tensor& tensor);

 protected:
  // Called by tie_parameter before the parameter `name` becomes `tensor`: a module whose forward
  // reads the parameter through a member points the member at `tensor`. The default refuses.
  virtual void parameter_tied(const std::string& name, const Tensor& tensor);
  // A new parameter [shape] (f32, CPU, requires_grad) named `name` (no dots) in this module.
  // kZeros / kOnes specs are applied at once; normal ones start at zero until
  // init_parameters(seed).
  Tensor register_parameter(const std::string& name, const Shape& shape, const Init& init);
  // A parameter that is the shard `shard` of the single-process parameter of the same full name;
  // `shape` must hold shard.local_numel() elements. init_parameters gives it exactly its part of
  // the single-process initialisation.
  Tensor register_parameter(const std::string& name, const Shape& shape, const Init& init,
                            const ShardSpec& shard);
  // Adopts an existing tensor (a leaf; e.g. one created from Python) as parameter `name` (no
  // dots): the module holds that very tensor, and init_parameters leaves its values alone.
  void adopt_parameter(const std::string& name, const Tensor& tensor);
  // Adopts `module` as child `name` (no dots); it may have no other parent.
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    adopt(name, module);
    return module;
  }
  // Joins this module's full name and a local name: "blocks.3" + "attn" -> "blocks.3.attn".
  std::string qualified(const std::string& local) const;

 private:
  struct Param {
    std::string name;
    Tensor tensor;
    Init init;
    std::optional<ShardSpec> shard;
    bool adopted = false;  // See adopt_parameter: initialised by its creator, not by init specs
  };
  void adopt(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;

  std::vector<Param> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  // Interleaving of params_ and children_ in registration order: (is_child, index).
  std::vector<std::pair<bool, size_t>> order_;
  std::vector<std::pair<int, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<int, ForwardHook>> post_hooks_;
  int next_hook_ = 0;
  std::string full_name_;
  bool has_parent_ = false;
  bool training_ = true;
};

// An indexed list of modules, named "0", "1", ... (GPT's blocks).
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return children().size(); }
  Module& operator[](size_t i) const { return *children().at(i).second; }
};

}  // namespace loom::nn
