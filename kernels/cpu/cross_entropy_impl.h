// Row helpers shared by the CPU cross-entropy kernels (cross_entropy.cpp and
// vocab_parallel_cross_entropy.cpp): a row's max, its sum of exponentials and its gradient,
// vectorised by Eigen. Internal to kernels/cpu; both kernels include it so that a row is computed
// by the same instructions in both, which is what keeps a one-rank vocab-parallel loss equal to
// core's.
//
// Note [Summing a row's exponentials]: each row's exponentials are evaluated by Eigen (vectorised
// exp) in chunks of kChunk columns, summed in f32 within a chunk and in double across chunks. At
// GPT-2's 50257 classes a running f32 sum of the row drifts by up to ~3e-6 of the log-sum-exp,
// more than the 1e-6 the loss must keep; the chunked sum stays near 1e-9.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/eigen.h"

namespace loom::kernels::cpu::detail {

constexpr int64_t kChunk = 1024;

using Row = Eigen::Map<Eigen::ArrayXf>;
using ConstRow = Eigen::Map<const Eigen::ArrayXf>;

// max(x[0, n)); -inf when n is 0.
inline float row_max(const float* x, int64_t n) {
  return n > 0 ? ConstRow(x, n).maxCoeff() : -std::numeric_limits<float>::infinity();
}

// sum(exp(x[0, n) - m)) in double. See Note [Summing a row's exponentials].
inline double row_sum_exp(const float* x, int64_t n, float m) {
  double sum = 0.0;
  for (int64_t c = 0; c < n; c += kChunk)
    sum += double((ConstRow(x + c, std::min(kChunk, n - c)) - m).exp().sum());
  return sum;
}

// One row's gradient: d[0, classes) = exp(x - lse) * scale, d[classes, cols) = 0, and scale
// taken off d[target] when target lies in [0, classes) (elsewhere the target is not in this row).
inline void row_cross_entropy_grad(const float* x, int64_t cols, int64_t classes, int64_t target,
                                   float lse, float scale, float* d) {
  Row(d, classes) = (ConstRow(x, classes) - lse).exp() * scale;
  std::fill(d + classes, d + cols, 0.0f);
  if (target >= 0 && target < classes) d[target] -= scale;
}

}  // namespace loom::kernels::cpu::detail
