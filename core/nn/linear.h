// Linear: y = x W^T + b, W stored (out, in) as in llm.c. GPT-2 init: W ~ normal(0, std), b = 0.
#pragma once

#include "core/nn/module.h"

namespace loom::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, double init_std = 0.02);
  Tensor forward(const Tensor& x) override;  // [..., in] -> [..., out]

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  Tensor weight;  // [out, in]
  Tensor bias;    // [out], undefined without bias

 protected:
  void parameter_tied(const std::string& name, const Tensor& tensor) override;

 private:
  int64_t in_, out_;
};

}  // namespace loom::nn
