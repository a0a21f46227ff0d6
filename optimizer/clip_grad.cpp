// Global-norm gradient clipping.
#include "optimizer/clip_grad.h"

#include <cmath>

#include "core/ops.h"

namespace loom::optim {

double grad_sum_of_squares(const std::vector<Tensor>& params) {
  double sum_sq = 0.0;
  for (const Tensor& p : params)
    if (p.defined() && p.grad().defined()) sum_sq += sum_of_squares(p.grad());
  return sum_sq;
}

void scale_grads_to_norm(const std::vector<Tensor>& params, double norm, double max_norm) {
  LOOM_CHECK(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double coef = max_norm / (norm + 1e-6);
  if (!std::isfinite(norm) || !(coef < 1.0)) return;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    if (!g.is_contiguous()) {
      g = g.detach().contiguous();
      const_cast<Tensor&>(p).set_grad(g);
    }
    scale_(g, coef);
  }
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  LOOM_CHECK(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double norm = std::sqrt(grad_sum_of_squares(params));
  scale_grads_to_norm(params, norm, max_norm);
  return norm;
}

}  // namespace loom::optim
