// SGD and AdamW updates. Scalars derived from hyper-parameters (bias corrections, the decay
// factor) are computed in double and rounded to f32 once, as PyTorch does when it passes a
// Python float to an f32 tensor op; the per-element math is f32 in PyTorch's operation order.
//
// Rounding is spelled out, so that it does not depend on the compiler (Note [Optimizer FMA
// contraction] in kernels/cuda/optimizer_update.cu, whose kernels round at the same places): this
// file is built with -ffp-contract=off (CMakeLists.txt), and every product that is fused is a
// `fused` call. Left to GCC's default contraction (-ffp-contract=fast), g++ 12 fused as the
// kernels do, but g++ 13 did not everywhere: on the GPU machine a fifth of the SGD elements with
// weight decay and momentum came out a few bits off the CUDA kernels.
#include "kernels/cpu/optimizer_update.h"

#include <cmath>

namespace loom::kernels::cpu {

namespace {

// a * b + c rounded once where the target has FMA (x86-64 -march=native builds: a vectorized
// vfmadd), else rounded twice: a libm fma per element would cost more than the whole update, so
// such a build (LOOM_NATIVE=OFF) differs from the CUDA kernels in the last bit of some elements.
inline float fused(float a, float b, float c) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, const SgdHyper& h) {
  const float wd = float(h.weight_decay), mom = float(h.momentum);
  const float damp = float(1.0 - h.dampening), neg_lr = float(-h.lr);
  const bool use_momentum = h.momentum != 0.0, first = h.first_step, nesterov = h.nesterov;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i];
    if (h.weight_decay != 0.0) g = fused(wd, param[i], g);  // grad.add(p, alpha=wd)
    if (use_momentum) {
      // buf.mul_(m).add_(g, 1-damp)
      const float b = first ? g : fused(momentum_buf[i], mom, damp * g);
      momentum_buf[i] = b;
      g = nesterov ? fused(mom, b, g) : b;
    }
    param[i] = fused(neg_lr, g, param[i]);  // p.add_(g, alpha=-lr)
  }
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWHyper& h) {
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2;
  const double step = double(h.step);
  const float decay = float(std::fma(-lr, h.weight_decay, 1.0));  // once: libm's fma is fine
  const float one_minus_b1 = float(1.0 - b1), one_minus_b2 = float(1.0 - b2);
  const double bias_correction1 = 1.0 - std::pow(b1, step);
  const double bias_correction2 = 1.0 - std::pow(b2, step);
  const float neg_step_size = float(-(lr / bias_correction1));
  const float bias_correction2_sqrt = float(std::sqrt(bias_correction2));
  const float beta1 = float(b1), beta2 = float(b2), eps = float(h.eps);
  const bool decays = h.weight_decay != 0.0;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    float p = param[i];
    if (decays) p = p * decay;                                   // param.mul_(1 - lr * wd)
    const float m = fused(exp_avg[i], beta1, one_minus_b1 * g);  // exp_avg.mul_(b1).add_(g, 1-b1)
    const float v = fused(exp_avg_sq[i], beta2, one_minus_b2 * (g * g));  // .addcmul_(g, g, 1-b2)
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    param[i] = fused(neg_step_size, m / denom, p);  // param.addcdiv_(m, denom, -step_size)
  }
}

}  // namespace loom::kernels::cpu
