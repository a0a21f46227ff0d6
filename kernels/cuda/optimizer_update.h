// SGD and AdamW updates on device memory: the CUDA twins of kernels/cpu/optimizer_update.h, with
// the same hyper-parameter structs and the same arithmetic, operation by operation, so a CUDA step
// gives the CPU's parameters and optimizer state bit for bit (see Note [Optimizer FMA contraction]
// in optimizer_update.cu for the one condition). All pointers are device memory; every call only
// enqueues work on `stream`.
//
// The *_multi forms update many tensors with one launch per kMaxTensorsPerLaunch tensors: the
// tensors' pointers and sizes travel by value in the kernel's parameters (no device-side pointer
// arrays, no allocation), and each block updates fixed-size chunks of the concatenated tensors.
// All tensors of one call share one hyper-parameter set (the same step count for AdamW).
#pragma once

#include <cstdint>

#include "kernels/cpu/optimizer_update.h"  // SgdHyper, AdamWHyper
#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

using cpu::AdamWHyper;
using cpu::SgdHyper;

// Tensors per launch of the *_multi kernels (their parameter block stays under CUDA's classic
// 4 KB kernel-parameter limit; more tensors take more launches).
constexpr int64_t kMaxTensorsPerLaunch = 64;

// As cpu::sgd_step. momentum_buf may be null when h.momentum == 0.
void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, const SgdHyper& h,
              Stream stream);

// As cpu::adamw_step.
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWHyper& h, Stream stream);

// One tensor of a multi-tensor update (device pointers; n == 0 is skipped, its pointers unread).
struct SgdTensor {
  float* param;
  const float* grad;
  float* momentum_buf;  // may be null when momentum == 0
  int64_t n;
};

// sgd_step on each of tensors[0, count) (a host array), in ceil(count / kMaxTensorsPerLaunch)
// launches. Each tensor gets exactly the result sgd_step would give it.
void sgd_step_multi(const SgdTensor* tensors, int64_t count, const SgdHyper& h, Stream stream);

struct AdamWTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;
};

// adamw_step on each of tensors[0, count) (a host array); as sgd_step_multi.
void adamw_step_multi(const AdamWTensor* tensors, int64_t count, const AdamWHyper& h,
                      Stream stream);

}  // namespace loom::kernels::cuda
