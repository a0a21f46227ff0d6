// DLRM's dense part. See dlrm_model.h.
#include "dlrm/dlrm_model.h"

#include <cmath>
#include <string>

#include "core/ops.h"

namespace loom::dlrm {

Mlp::Mlp(const std::vector<int64_t>& widths, bool relu_last) : relu_last_(relu_last) {
  LOOM_CHECK(widths.size() >= 2, "Mlp: needs an input and an output width");
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    // He-style init for ReLU layers: std sqrt(2 / fan_in).
    const double std = std::sqrt(2.0 / double(widths[i]));
    layers_.push_back(
        register_module("fc" + std::to_string(i),
                        std::make_shared<nn::Linear>(widths[i], widths[i + 1], true, std)));
  }
}

Tensor Mlp::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = (*layers_[i])(h);
    if (i + 1 < layers_.size() || relu_last_) h = relu(h);
  }
  return h;
}

DlrmDense::DlrmDense(const DlrmConfig& config) : config_(config) {
  LOOM_CHECK(config.num_dense > 0 && config.num_tables > 0 && config.dim > 0,
             "DlrmDense: num_dense, num_tables and dim must be positive");
  std::vector<int64_t> bottom = {config.num_dense};
  bottom.insert(bottom.end(), config.bottom.begin(), config.bottom.end());
  bottom.push_back(config.dim);
  const int64_t features = config.num_tables + 1;
  std::vector<int64_t> top = {config.dim + features * (features - 1) / 2};
  top.insert(top.end(), config.top.begin(), config.top.end());
  top.push_back(1);
  bottom_ = register_module("bottom", std::make_shared<Mlp>(bottom, /*relu_last=*/true));
  top_ = register_module("top", std::make_shared<Mlp>(top, /*relu_last=*/false));
}

Tensor DlrmDense::logits(const Tensor& dense, const Tensor& pooled) {
  const int64_t b = dense.size(0), t = config_.num_tables, d = config_.dim;
  LOOM_CHECK(pooled.dim() == 2 && pooled.size(0) == b && pooled.size(1) == t * d,
             "DlrmDense: pooled embeddings are ", shape_str(pooled.shape()), ", expected [", b,
             ", ", t * d, "]");
  Tensor x = (*bottom_)(dense);                                                   // [B, D]
  Tensor features = cat({reshape(x, {b, 1, d}), reshape(pooled, {b, t, d})}, 1);  // [B, T+1, D]
  Tensor z = dot_interaction(features);                                           // [B, (T+1)T/2]
  return reshape((*top_)(cat({x, z}, 1)), {b});
}

}  // namespace loom::dlrm
