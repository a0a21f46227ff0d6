// Module bookkeeping: registration, hierarchical names, state dicts, modes, init.
#include "core/nn/module.h"

#include <unordered_set>

#include <set>

#include "core/autograd.h"

namespace loom::nn {

namespace {

std::string join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

std::string list_str(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s;
}

}  // namespace

Tensor Module::forward(const Tensor&) {
  LOOM_FAIL("Module '", full_name_.empty() ? "<root>" : full_name_, "' has no forward(x)");
}

Tensor Module::operator()(const Tensor& x) {
  run_forward_pre_hooks();
  return run_forward_hooks(forward(x));
}

void Module::run_forward_pre_hooks() {
  for (auto& [handle, hook] : pre_hooks_) hook(*this);
}

Tensor Module::run_forward_hooks(const Tensor& output) {
  Tensor y = output;
  for (auto& [handle, hook] : post_hooks_) y = hook(*this, y);
  return y;
}

int Module::add_forward_pre_hook(ForwardPreHook hook) {
  LOOM_CHECK(hook != nullptr, "Module '", full_name_, "': null forward pre-hook");
  pre_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

int Module::add_forward_hook(ForwardHook hook) {
  LOOM_CHECK(hook != nullptr, "Module '", full_name_, "': null forward hook");
  post_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

void Module::remove_hook(int handle) {
  std::erase_if(pre_hooks_, [&](const auto& h) { return h.first == handle; });
  std::erase_if(post_hooks_, [&](const auto& h) { return h.first == handle; });
}

std::string Module::qualified(const std::string& local) const { return join(full_name_, local); }

void Module::check_new_name(const std::string& name) const {
  LOOM_CHECK(!name.empty() && name.find('.') == std::string::npos, "Module '", full_name_,
             "': name '", name, "' must be non-empty and contain no '.'");
  for (const Param& p : params_)
    LOOM_CHECK(p.name != name, "Module '", full_name_, "': '", name, "' is already a parameter");
  for (const auto& [n, m] : children_)
    LOOM_CHECK(n != name, "Module '", full_name_, "': '", name, "' is already a submodule");
}

Tensor Module::register_parameter(const std::string& name, const Shape& shape, const Init& init) {
  check_new_name(name);
  Tensor t = Tensor::zeros(shape);  // a normal spec stays zero until init_parameters
  if (init.kind == Init::Kind::kOnes) init_tensor(t, init, 0, qualified(name));
  t.set_requires_grad(true);
  order_.emplace_back(false, params_.size());
  params_.push_back(Param{name, t, init, std::nullopt});
  return t;
}

Tensor Module::register_parameter(const std::string& name, const Shape& shape, const Init& init,
                                  const ShardSpec& shard) {
  LOOM_CHECK(shard.dim >= 0 && shard.dim < int64_t(shard.view_shape.size()) &&
                 shape_numel(shard.view_shape) == shape_numel(shard.full_shape) &&
                 shard.start >= 0 && shard.length >= 0 &&
                 shard.start + shard.length <= shard.view_shape[size_t(shard.dim)],
             "Module '", full_name_, "': parameter '", name, "' has an invalid shard ", shard.str(),
             " of ", shape_str(shard.full_shape));
  LOOM_CHECK(shape_numel(shape) == shard.local_numel(), "Module '", full_name_, "': parameter '",
             name, "' of shape ", shape_str(shape), " cannot hold the shard ", shard.str());
  Tensor t = register_parameter(name, shape, init);
  params_.back().shard = shard;
  return t;
}

void Module::adopt_parameter(const std::string& name, const Tensor& tensor) {
  check_new_name(name);
  LOOM_CHECK(tensor.defined() && tensor.is_leaf() && tensor.requires_grad(), "Module '", full_name_,
             "': parameter '", name, "' must be a leaf tensor that requires grad");
  order_.emplace_back(false, params_.size());
  params_.push_back(Param{name, tensor, Init::zeros(), std::nullopt, true});
}

void Module::adopt(const std::string& name, std::shared_ptr<Module> module) {
  LOOM_CHECK(module != nullptr, "Module '", full_name_, "': submodule '", name, "' is null");
  LOOM_CHECK(module.get() != this, "Module '", full_name_, "': cannot register itself as '", name,
             "'");
  LOOM_CHECK(!module->has_parent_, "Module '", full_name_, "': submodule '", name,
             "' already belongs to another module (as '", module->full_name_, "')");
  check_new_name(name);
  module->has_parent_ = true;
  module->set_full_name(join(full_name_, name));
  order_.emplace_back(true, children_.size());
  children_.emplace_back(name, std::move(module));
}

void Module::parameter_tied(const std::string& name, const Tensor&) {
  LOOM_FAIL("Module '", full_name_.empty() ? "<root>" : full_name_, "': parameter '", name,
            "' cannot be shared with another module (this module's forward holds its own "
            "tensor; weight tying works for Linear, Embedding and LayerNorm parameters)");
}

void Module::tie_parameter(const std::string& name, const Tensor& tensor) {
  Param* slot = nullptr;
  for (Param& p : params_)
    if (p.name == name) slot = &p;
  LOOM_CHECK(slot != nullptr, "Module '", full_name_, "': no parameter named '", name,
             "' of its own to tie");
  LOOM_CHECK(tensor.defined() && tensor.is_leaf(), "Module '", full_name_, "': parameter '", name,
             "' can only be tied to a leaf tensor (another module's parameter)");
  LOOM_CHECK(tensor.shape() == slot->tensor.shape() && tensor.dtype() == slot->tensor.dtype() &&
                 tensor.device() == slot->tensor.device(),
             "Module '", full_name_, "': parameter '", name, "' is ",
             shape_str(slot->tensor.shape()), " ", dtype_name(slot->tensor.dtype()), " on ",
             slot->tensor.device().str(), "; it cannot be tied to a ", shape_str(tensor.shape()),
             " ", dtype_name(tensor.dtype()), " tensor on ", tensor.device().str());
  LOOM_CHECK(!slot->shard, "Module '", full_name_, "': parameter '", name,
             "' is a tensor-parallel shard; it cannot be tied");
  parameter_tied(name, tensor);
  slot->tensor = tensor;
  slot->adopted = true;  // initialised by the module it came from
}

void Module::set_full_name(const std::string& name) {
  full_name_ = name;
  for (auto& [n, m] : children_) m->set_full_name(join(name, n));
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (auto [is_child, i] : order_) {
    if (is_child)
      children_[i].second->collect(join(prefix, children_[i].first), out);
    else
      out.emplace_back(join(prefix, params_[i].name), params_[i].tensor);
  }
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", all);
  // A tied tensor (See tie_parameter) once, under its first name, as PyTorch's named_parameters:
  // optimizers, DDP buckets and ZeRO shards must not hold it twice.
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  for (auto& entry : all)
    if (seen.insert(entry.second.impl().get()).second) out.push_back(std::move(entry));
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

const ShardSpec* Module::parameter_shard(const std::string& name) const {
  const size_t dot = name.find('.');
  if (dot == std::string::npos) {
    for (const Param& p : params_)
      if (p.name == name) return p.shard ? &*p.shard : nullptr;
  } else {
    const std::string head = name.substr(0, dot);
    for (const auto& [n, m] : children_)
      if (n == head) return m->parameter_shard(name.substr(dot + 1));
  }
  LOOM_FAIL("Module '", full_name_, "': no parameter named '", name, "'");
}

const Init& Module::parameter_init(const std::string& name) const {
  const size_t dot = name.find('.');
  if (dot == std::string::npos) {
    for (const Param& p : params_)
      if (p.name == name) return p.init;
  } else {
    const std::string head = name.substr(0, dot);
    for (const auto& [n, m] : children_)
      if (n == head) return m->parameter_init(name.substr(dot + 1));
  }
  LOOM_FAIL("Module '", full_name_, "': no parameter named '", name, "'");
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [n, t] : named_parameters()) out.emplace(n, t);
  return out;
}

LoadResult Module::load_state_dict(const StateDict& state, bool strict) {
  const auto named = named_parameters();
  LoadResult result;
  std::set<std::string> known;
  // Check everything first so a failed load leaves the module untouched.
  for (const auto& [name, param] : named) {
    known.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      result.missing.push_back(name);
      continue;
    }
    const Tensor& src = it->second;
    LOOM_CHECK(src.defined(), "load_state_dict: '", name, "' is undefined in the state dict");
    LOOM_CHECK(src.shape() == param.shape(), "load_state_dict: '", name, "' has shape ",
               shape_str(src.shape()), " in the state dict but ", shape_str(param.shape()),
               " in the module");
    LOOM_CHECK(src.dtype() == param.dtype() || is_floating(src.dtype()), "load_state_dict: '", name,
               "' has dtype ", dtype_name(src.dtype()), " in the state dict but ",
               dtype_name(param.dtype()), " in the module");
  }
  for (const auto& [name, t] : state)
    if (!known.count(name)) result.unexpected.push_back(name);
  if (strict) {
    LOOM_CHECK(result.missing.empty() && result.unexpected.empty(), "load_state_dict (strict): ",
               result.missing.empty() ? "" : "missing keys: " + list_str(result.missing),
               !result.missing.empty() && !result.unexpected.empty() ? "; " : "",
               result.unexpected.empty() ? "" : "unexpected keys: " + list_str(result.unexpected));
  }
  NoGradGuard no_grad;
  for (const auto& [name, param] : named) {
    auto it = state.find(name);
    if (it == state.end() || it->second.same_as(param)) continue;
    Tensor src = it->second.detach();
    if (src.dtype() != param.dtype()) src = src.to(param.dtype());
    Tensor dst = param;
    dst.copy_(src);
  }
  return result;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::zero_grad() {
  for (Param& p : params_) p.tensor.zero_grad();
  for (auto& [n, m] : children_) m->zero_grad();
}

void Module::init_parameters(uint64_t seed) {
  for (Param& p : params_) {
    if (p.adopted) continue;
    if (!p.shard) {
      init_tensor(p.tensor, p.init, seed, qualified(p.name));
      continue;
    }
    // The shard's part of the full parameter's initialisation, See Note [Deterministic init].
    Tensor local = Tensor::zeros(p.shard->local_view_shape(), p.tensor.dtype());
    const rng::Slice slice{p.shard->view_shape, p.shard->dim, p.shard->start};
    init_tensor(local, p.init, seed, qualified(p.name), &slice);
    NoGradGuard no_grad;
    p.tensor.detach().copy_(local.reshape(p.tensor.shape()));
  }
  for (auto& [n, m] : children_) m->init_parameters(seed);
}

void Module::to(DType dtype) {
  LOOM_CHECK(is_floating(dtype), "Module::to: dtype ", dtype_name(dtype),
             " is not floating; parameters can be f32, bf16 or f16");
  for (auto& [name, param] : named_parameters()) {
    Tensor p = param;
    p.zero_grad();
    p.to_(dtype);
  }
}

void Module::to(Device device) {
  for (auto& [name, param] : named_parameters()) {
    Tensor p = param;
    p.zero_grad();
    p.to_(device);
  }
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(size()), std::move(module));
}

}  // namespace loom::nn
