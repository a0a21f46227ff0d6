#include "core/nn/layer_norm.h"

#include "core/ops.h"

namespace loom::nn {

LayerNorm::LayerNorm(int64_t dim, double eps) : dim_(dim), eps_(eps) {
  LOOM_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  weight = register_parameter("weight", {dim}, Init::ones());
  bias = register_parameter("bias", {dim}, Init::zeros());
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, weight, bias, eps_); }

void LayerNorm::parameter_tied(const std::string& name, const Tensor& tensor) {
  (name == "weight" ? weight : bias) = tensor;
}

}  // namespace loom::nn
