// The GPT-2 feed-forward block: fc (C -> 4C), GELU (tanh), proj (4C -> C), residual dropout.
#pragma once

#include <memory>

#include "core/nn/dropout.h"
#include "core/nn/linear.h"

namespace loom::nn {

class MLP : public Module {
 public:
  // proj_std: GPT-2 scales residual projections to 0.02 / sqrt(2 * layers).
  MLP(int64_t channels, double dropout = 0.0, double proj_std = 0.02);
  Tensor forward(const Tensor& x) override;  // [..., C] -> [..., C]

  std::shared_ptr<Linear> fc;     // weight [4C, C]
  std::shared_ptr<Linear> proj;   // weight [C, 4C]
  std::shared_ptr<Dropout> drop;  // on proj's output
};

}  // namespace loom::nn
