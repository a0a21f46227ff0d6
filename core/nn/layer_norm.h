// LayerNorm over the last dim, with a learned scale (init 1) and shift (init 0).
#pragma once

#include "core/nn/module.h"

namespace loom::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;  // [..., dim] -> [..., dim]

  Tensor weight;  // [dim]
  Tensor bias;    // [dim]

 protected:
  void parameter_tied(const std::string& name, const Tensor& tensor) override;

 private:
  int64_t dim_;
  double eps_;
};

}  // namespace loom::nn
