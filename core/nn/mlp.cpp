#include "core/nn/mlp.h"

#include "core/ops.h"

namespace loom::nn {

MLP::MLP(int64_t channels, double dropout, double proj_std, int64_t hidden) {
  LOOM_CHECK(hidden >= 0, "MLP: hidden must be >= 0 (0: 4 x channels), got ", hidden);
  const int64_t h = hidden > 0 ? hidden : 4 * channels;
  fc = register_module("fc", std::make_shared<Linear>(channels, h));
  proj = register_module("proj", std::make_shared<Linear>(h, channels, true, proj_std));
  drop = register_module("drop", std::make_shared<Dropout>(dropout));
}

Tensor MLP::forward(const Tensor& x) { return (*drop)((*proj)(gelu((*fc)(x)))); }

}  // namespace loom::nn
