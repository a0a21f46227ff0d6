#include "core/nn/linear.h"

#include "core/ops.h"

namespace loom::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias_on, double init_std)
    : in_(in_features), out_(out_features) {
  LOOM_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in ",
             in_features, " out ", out_features);
  weight = register_parameter("weight", {out_features, in_features}, Init::normal(init_std));
  if (bias_on) bias = register_parameter("bias", {out_features}, Init::zeros());
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

void Linear::parameter_tied(const std::string& name, const Tensor& tensor) {
  (name == "weight" ? weight : bias) = tensor;
}

}  // namespace loom::nn
