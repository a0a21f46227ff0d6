// Shared optimizer plumbing: argument checks, gradient access, state accounting, saving and
// loading the state.
#include "optimizer/optimizer.h"

#include <set>

namespace loom::optim {
namespace {

std::string step_key(size_t param_index) { return std::to_string(param_index) + ".step"; }

// "a, b, c", at most kMaxListed of them and then how many there are in all.
std::string join_keys(const std::vector<std::string>& keys) {
  constexpr size_t kMaxListed = 8;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kMaxListed; ++i) out += (i ? ", " : "") + keys[i];
  if (keys.size() > kMaxListed) out += ", ... (" + std::to_string(keys.size()) + " in all)";
  return out;
}

}  // namespace

bool split_state_key(const std::string& key, size_t& index, std::string& kind) {
  const size_t dot = key.find('.');
  if (dot == 0 || dot == std::string::npos) return false;
  index = 0;
  for (size_t k = 0; k < dot; ++k) {
    if (key[k] < '0' || key[k] > '9') return false;
    index = index * 10 + size_t(key[k] - '0');
  }
  kind = key.substr(dot + 1);
  return true;
}

Optimizer::Optimizer(const char* name, std::vector<Tensor> params, double lr, bool f32_only)
    : name_(name), params_(std::move(params)), lr_(lr) {
  LOOM_CHECK(lr >= 0.0, name_, ": learning rate must be >= 0, got ", lr);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    LOOM_CHECK(p.defined(), name_, ": parameter ", i, " is undefined");
    LOOM_CHECK(p.dtype() == DType::kF32 || (!f32_only && is_floating(p.dtype())), name_,
               ": parameter ", i, " ", p.str(),
               " must be f32 (optimizers update f32 parameters; train bf16 or f16 ones with f32 "
               "master weights: MixedPrecisionOptimizer, or ZeRO)");
    LOOM_CHECK(p.is_contiguous(), name_, ": parameter ", i, " ", p.str(), " is not contiguous");
    for (size_t j = 0; j < i; ++j)
      LOOM_CHECK(!params_[j].same_as(p), name_, ": parameter ", i, " is the same tensor as ", j,
                 " (each parameter may appear once)");
  }
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

void Optimizer::set_lr(double lr) {
  LOOM_CHECK(lr >= 0.0, name_, ": learning rate must be >= 0, got ", lr);
  lr_ = lr;
}

size_t Optimizer::state_bytes() const {
  size_t total = 0;
  for (const auto& [name, t] : state()) total += t.nbytes();
  return total;
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  LOOM_FAIL(name_, ": this optimizer does not implement state_dict (one that wraps another must ",
            "forward it to the wrapped one)");
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>&) {
  LOOM_FAIL(name_, ": this optimizer does not implement load_state_dict (one that wraps another ",
            "must forward it to the wrapped one)");
}

std::map<std::string, Tensor> Optimizer::state_dict_with_steps(
    const std::vector<int64_t>& steps) const {
  LOOM_ASSERT(steps.size() == params_.size(), name_, ": ", steps.size(), " step counts for ",
              params_.size(), " parameters");
  std::map<std::string, Tensor> out;
  for (const auto& [key, t] : state()) out.emplace(key, t.detach().clone());
  for (size_t i = 0; i < steps.size(); ++i)
    out.emplace(step_key(i), Tensor::from_vector(std::vector<int64_t>{steps[i]}, {1}));
  return out;
}

void Optimizer::load_state_dict_with_steps(const std::map<std::string, Tensor>& state,
                                           std::vector<int64_t>& steps) {
  LOOM_ASSERT(steps.size() == params_.size(), name_, ": ", steps.size(), " step counts for ",
              params_.size(), " parameters");
  // Every check comes before the first copy. See Note [Optimizer state dict].
  std::vector<std::pair<std::string, Tensor>> targets = this->state();  // the live tensors
  std::vector<std::string> expected;
  for (const auto& [key, t] : targets) expected.push_back(key);
  for (size_t i = 0; i < steps.size(); ++i) expected.push_back(step_key(i));
  const std::set<std::string> known(expected.begin(), expected.end());
  std::vector<std::string> missing, unexpected;
  for (const std::string& key : expected)
    if (state.count(key) == 0) missing.push_back(key);
  for (const auto& [key, t] : state)
    if (known.count(key) == 0) unexpected.push_back(key);
  LOOM_CHECK(missing.empty() && unexpected.empty(), name_,
             ": load_state_dict: the state does not fit this optimizer:",
             missing.empty() ? "" : " missing " + join_keys(missing) + ";",
             unexpected.empty() ? "" : " unexpected " + join_keys(unexpected) + ";",
             " hint: load a state_dict() of the same optimizer with the same options over the ",
             params_.size(), " parameters");

  for (const auto& [key, target] : targets) {
    const Tensor& t = state.at(key);
    LOOM_CHECK(t.defined(), name_, ": load_state_dict: '", key, "' is undefined");
    LOOM_CHECK(t.dtype() == target.dtype(), name_, ": load_state_dict: '", key, "' is ",
               dtype_name(t.dtype()), " but this optimizer's is ", dtype_name(target.dtype()));
    LOOM_CHECK(t.shape() == target.shape(), name_, ": load_state_dict: '", key, "' has shape ",
               shape_str(t.shape()), " but this optimizer's has shape ", shape_str(target.shape()));
  }
  std::vector<int64_t> loaded(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string key = step_key(i);
    const Tensor& t = state.at(key);
    LOOM_CHECK(t.defined(), name_, ": load_state_dict: '", key, "' is undefined");
    LOOM_CHECK(t.dtype() == DType::kI64 && t.numel() == 1, name_, ": load_state_dict: '", key,
               "' is ", t.str(), " but a step count is one i64 value");
    loaded[i] = t.to_vector<int64_t>()[0];
    LOOM_CHECK(loaded[i] >= 0, name_, ": load_state_dict: '", key, "' is ", loaded[i],
               " but a step count is >= 0");
  }

  for (auto& [key, target] : targets) {
    const Tensor& from = state.at(key);
    // A state dict may hold the live tensors themselves (a checkpoint load fills them in place):
    // nothing to copy.
    if (from.device() == target.device() && from.data_ptr() == target.data_ptr() &&
        from.is_contiguous() && target.is_contiguous())
      continue;
    target.copy_(from);
  }
  steps = std::move(loaded);
}

Tensor Optimizer::grad_for_update(size_t i) const {
  const Tensor& p = params_[i];
  const Tensor& g = p.grad();
  if (!g.defined()) return Tensor();
  LOOM_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(), name_,
             ": gradient ", g.str(), " of parameter ", i, " does not match the parameter ",
             p.str());
  return g.detach().contiguous();
}

void Optimizer::require_f32(const Tensor& param) const {
  LOOM_CHECK(param.dtype() == DType::kF32, name_, ": parameter ", param.str(),
             " is not f32; the update kernels keep f32 weights (train bf16/f16 models through "
             "MixedPrecisionOptimizer, which holds f32 master weights)");
}

}  // namespace loom::optim
