#include "core/nn/mlp.h"

#include "core/ops.h"

namespace loom::nn {

MLP::MLP(int64_t channels, double dropout, double proj_std) {
  fc = register_module("fc", std::make_shared<Linear>(channels, 4 * channels));
  proj = register_module("proj", std::make_shared<Linear>(4 * channels, channels, true, proj_std));
  drop = register_module("drop", std::make_shared<Dropout>(dropout));
}

Tensor MLP::forward(const Tensor& x) { return (*drop)((*proj)(gelu((*fc)(x)))); }

}  // namespace loom::nn
