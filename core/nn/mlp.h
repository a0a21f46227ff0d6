// The GPT-2 feed-forward block: fc (C -> 4C), GELU (tanh), proj (4C -> C), residual dropout.
#pragma once

#include <memory>

#include "core/nn/dropout.h"
#include "core/nn/linear.h"

namespace loom::nn {

class MLP : public Module {
 public:
  // proj_std: GPT-2 scales residual projections to 0.02 / sqrt(2 * layers). hidden: the inner
  // width (0: 4 x channels, GPT-2's; a MoE's experts may be narrower).
  MLP(int64_t channels, double dropout = 0.0, double proj_std = 0.02, int64_t hidden = 0);
  Tensor forward(const Tensor& x) override;  // [..., C] -> [..., C]

  std::shared_ptr<Linear> fc;     // weight [hidden, C]
  std::shared_ptr<Linear> proj;   // weight [C, hidden]
  std::shared_ptr<Dropout> drop;  // on proj's output
};

}  // namespace loom::nn
