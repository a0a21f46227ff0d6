#include "optimizer/master_weights.h"

#include <cmath>

#include "core/autograd.h"
#include "core/ops.h"

namespace loom::optim {

bool is_low_precision(DType dtype) { return dtype == DType::kBF16 || dtype == DType::kF16; }

MasterWeights::MasterWeights(std::vector<Tensor> model) : model_(std::move(model)) {
  for (size_t i = 0; i < model_.size(); ++i) {
    const Tensor& m = model_[i];
    LOOM_CHECK(m.defined() && is_low_precision(m.dtype()), "MasterWeights: tensor ", i, " is ",
               m.defined() ? m.str() : "undefined", "; f32 masters are kept for bf16 or f16 ones");
    masters_.push_back(m.detach().to(DType::kF32).contiguous());
  }
}

bool MasterWeights::set_gradients(const std::vector<Tensor>& grads, double inv_scale) {
  LOOM_CHECK(grads.size() == masters_.size(), "MasterWeights: ", grads.size(), " gradients for ",
             masters_.size(), " masters");
  NoGradGuard no_grad;
  bool finite = true;
  for (size_t i = 0; i < masters_.size(); ++i) {
    Tensor& master = masters_[i];
    if (!grads[i].defined()) {
      master.set_grad(Tensor());
      continue;
    }
    Tensor g = grads[i].detach().to(DType::kF32).contiguous();
    if (g.storage() == grads[i].storage()) g = g.clone();  // an f32 gradient: keep the caller's
    if (inv_scale != 1.0) scale_(g, inv_scale);
    if (g.device().is_cpu()) {
      const float* p = g.data<float>();
      for (int64_t k = 0, n = g.numel(); k < n && finite; ++k) finite = std::isfinite(p[k]);
    } else if (finite) {
      // Device memory: the f64 sum of squares is finite exactly when every element is (an f32
      // square is below 2^256, so no finite sum of fewer than 2^700 of them overflows).
      finite = std::isfinite(sum_of_squares(g));
    }
    master.set_grad(g.reshape(master.shape()));
  }
  return finite;
}

void MasterWeights::clear_gradients() {
  for (Tensor& m : masters_) m.set_grad(Tensor());
}

void MasterWeights::copy_to_model() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) {
    Tensor target = model_[i];
    target.copy_(masters_[i].to(target.dtype()).reshape(target.shape()));
  }
}

size_t MasterWeights::bytes() const {
  size_t total = 0;
  for (const Tensor& m : masters_) total += m.nbytes();
  return total;
}

}  // namespace loom::optim
