#include "parallel/tensor_parallel/tp_grad_norm.h"

#include <cmath>

#include "optimizer/clip_grad.h"

namespace loom::parallel {

double tp_grad_sum_of_squares(const nn::Module& model, comm::Communicator& tp) {
  return tp_grad_sum_of_squares(model, tp, [](const std::string&) { return true; });
}

double tp_grad_sum_of_squares(const nn::Module& model, comm::Communicator& tp,
                              const std::function<bool(const std::string&)>& counted) {
  std::vector<Tensor> sharded, whole;
  for (const auto& [name, p] : model.named_parameters())
    if (counted(name)) (model.parameter_shard(name) ? sharded : whole).push_back(p);
  Tensor parts = Tensor::full({1}, optim::grad_sum_of_squares(sharded), DType::kF32);
  tp.allreduce(parts)->wait();
  return parts.item() + optim::grad_sum_of_squares(whole);
}

double tp_clip_grad_norm(const nn::Module& model, double max_norm, comm::Communicator& tp) {
  LOOM_CHECK(max_norm > 0.0, "tp_clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double norm = std::sqrt(tp_grad_sum_of_squares(model, tp));
  optim::scale_grads_to_norm(model.parameters(), norm, max_norm);
  return norm;
}

}  // namespace loom::parallel
