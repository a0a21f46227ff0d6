#include "parallel/tensor_parallel/tp_state.h"

#include "core/autograd.h"
#include "core/ops.h"

namespace loom::parallel {

nn::StateDict gather_full_state(const nn::Module& module, comm::Communicator& tp) {
  NoGradGuard no_grad;
  nn::StateDict out;
  for (const auto& [name, p] : module.named_parameters()) {
    const nn::ShardSpec* shard = module.parameter_shard(name);
    if (!shard) {
      out.emplace(name, p.detach().clone());
      continue;
    }
    LOOM_CHECK(shard->start == int64_t(tp.rank()) * shard->length &&
                   shard->length * tp.size() == shard->view_shape[size_t(shard->dim)],
               "gather_full_state: parameter '", name, "' is the shard ", shard->str(),
               ", not this rank's equal part of ", tp.size(), " over group '", tp.name(), "'");
    Tensor local = p.detach().contiguous().reshape(shard->local_view_shape());
    out.emplace(name, all_gather_along(local, tp, shard->dim).reshape(shard->full_shape));
  }
  return out;
}

void load_full_state(nn::Module& module, const nn::StateDict& full) {
  NoGradGuard no_grad;
  const auto named = module.named_parameters();
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, p] : named)
    if (!full.count(name)) missing.push_back(name);
  for (const auto& [name, t] : full) {
    bool known = false;
    for (const auto& [n, p] : named) known = known || n == name;
    if (!known) unexpected.push_back(name);
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s;
  };
  LOOM_CHECK(missing.empty() && unexpected.empty(), "load_full_state: the weights do not fit the ",
             "model:", missing.empty() ? "" : " missing " + list(missing) + ";",
             unexpected.empty() ? "" : " unexpected " + list(unexpected) + ";");
  std::vector<std::pair<Tensor, Tensor>> copies;  // (parameter, value), checked before copying
  for (const auto& [name, p] : named) {
    Tensor value = full.at(name);
    const nn::ShardSpec* shard = module.parameter_shard(name);
    const Shape& want = shard ? shard->full_shape : p.shape();
    const int64_t zero_rows_from = module.parameter_init(name).zero_rows_from;
    if (shard && zero_rows_from >= 0 && value.dim() == int64_t(want.size()) && value.dim() > 0 &&
        value.size(0) >= zero_rows_from && value.size(0) < want[0]) {
      Shape tail(want.begin() + 1, want.end());
      Shape got_tail(value.shape().begin() + 1, value.shape().end());
      if (tail == got_tail) {  // zero rows past the file's, See the header
        Tensor padded = Tensor::zeros(want, value.dtype());
        padded.narrow(0, 0, value.size(0)).copy_(value.detach());
        value = padded;
      }
    }
    LOOM_CHECK(value.shape() == want, "load_full_state: '", name, "' has shape ",
               shape_str(value.shape()), " but the model's full parameter is ", shape_str(want));
    if (value.dtype() != p.dtype()) value = value.detach().to(p.dtype());
    copies.emplace_back(p, shard ? shard->slice_of(value).reshape(p.shape()) : value);
  }
  for (auto& [p, v] : copies) Tensor(p).detach().copy_(v);
}

}  // namespace loom::parallel
