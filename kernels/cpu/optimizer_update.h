// Optimizer update kernels on raw f32 pointers: one call updates one parameter in place. The
// arithmetic mirrors PyTorch's single-tensor CPU implementations (torch.optim.SGD, AdamW)
// operation by operation in f32, so loom's updates match PyTorch's to rounding.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// Hyper-parameters are doubles, as Python floats are in PyTorch; the kernels round them to f32
// where PyTorch's tensor ops do and keep them double where PyTorch computes in Python.
struct SgdHyper {
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // coupled: g += weight_decay * p
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer is initialised to g (no dampening), as PyTorch
};

// p -= lr * d, where g = grad + wd * p; buf = momentum * buf + (1 - dampening) * g (buf = g on
// the first step); d = g + momentum * buf (nesterov) or buf (momentum != 0) or g.
// momentum_buf may be null when momentum == 0.
void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, const SgdHyper& h);

struct AdamWHyper {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled: p *= 1 - lr * weight_decay
  int64_t step = 1;           // 1-based count of updates this parameter has received
};

// p *= 1 - lr * wd; m = beta1 * m + (1 - beta1) * g; v = beta2 * v + (1 - beta2) * g * g;
// p -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps).
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWHyper& h);

}  // namespace loom::kernels::cpu
