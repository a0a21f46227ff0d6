// A row's max, sum of exponentials and gradient are computed by the same helpers as core's
// cross_entropy (cross_entropy_impl.h; see Note [Summing a row's exponentials]), so one rank
// holding every column gets core's row sums and gradients; only the f32 rounding of the summed
// exponentials before their allreduce differs. The loops over the logits run on OpenMP threads
// by rows, as core's do; the per-row losses are added in row order, so the loss does not depend
// on the thread count.
#include "kernels/cpu/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cross_entropy_impl.h"

namespace loom::kernels::cpu {

namespace {

using Shape = VocabParallelCrossEntropyShape;

template <typename I>
void local_stats_impl(const float* logits, const I* targets, float* local_max,
                      double* local_sum_exp, const Shape& s) {
#pragma omp parallel for schedule(static) if (s.rows * s.cols > (1 << 15))
  for (int64_t r = 0; r < s.rows; ++r) {
    if (int64_t(targets[r]) == s.ignore_index || s.local_classes == 0) {
      local_max[r] = -std::numeric_limits<float>::infinity();
      local_sum_exp[r] = 0.0;
      continue;
    }
    const float* x = logits + r * s.cols;
    const float m = detail::row_max(x, s.local_classes);
    local_max[r] = m;
    local_sum_exp[r] = detail::row_sum_exp(x, s.local_classes, m);
  }
}

template <typename I>
void target_logit_impl(const float* logits, const I* targets, float* target_logit, const Shape& s) {
  for (int64_t r = 0; r < s.rows; ++r) {
    const int64_t t = int64_t(targets[r]) - s.start;
    const bool here = int64_t(targets[r]) != s.ignore_index && t >= 0 && t < s.local_classes;
    target_logit[r] = here ? logits[r * s.cols + t] : 0.0f;
  }
}

template <typename I>
double loss_impl(const I* targets, const float* row_max, const float* sum_exp,
                 const float* target_logit, float* lse, const Shape& s, int64_t* count) {
  double total = 0.0;
  int64_t counted = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    if (int64_t(targets[r]) == s.ignore_index) {
      lse[r] = 0.0f;
      continue;
    }
    const double l = double(row_max[r]) + std::log(double(sum_exp[r]));
    lse[r] = float(l);
    total += l - double(target_logit[r]);
    ++counted;
  }
  *count = counted;
  return total;
}

template <typename I>
void backward_impl(const float* logits, const I* targets, const float* lse, float scale,
                   float* dlogits, const Shape& s) {
#pragma omp parallel for schedule(static) if (s.rows * s.cols > (1 << 15))
  for (int64_t r = 0; r < s.rows; ++r) {
    float* d = dlogits + r * s.cols;
    const int64_t target = int64_t(targets[r]);
    if (target == s.ignore_index) {
      std::fill(d, d + s.cols, 0.0f);
      continue;
    }
    detail::row_cross_entropy_grad(logits + r * s.cols, s.cols, s.local_classes, target - s.start,
                                   lse[r], scale, d);
  }
}

}  // namespace

void vocab_parallel_cross_entropy_local_stats(const float* logits, const int32_t* targets,
                                              float* local_max, double* local_sum_exp,
                                              const VocabParallelCrossEntropyShape& shape) {
  local_stats_impl(logits, targets, local_max, local_sum_exp, shape);
}
void vocab_parallel_cross_entropy_local_stats(const float* logits, const int64_t* targets,
                                              float* local_max, double* local_sum_exp,
                                              const VocabParallelCrossEntropyShape& shape) {
  local_stats_impl(logits, targets, local_max, local_sum_exp, shape);
}

void vocab_parallel_cross_entropy_target_logit(const float* logits, const int32_t* targets,
                                               float* target_logit,
                                               const VocabParallelCrossEntropyShape& shape) {
  target_logit_impl(logits, targets, target_logit, shape);
}
void vocab_parallel_cross_entropy_target_logit(const float* logits, const int64_t* targets,
                                               float* target_logit,
                                               const VocabParallelCrossEntropyShape& shape) {
  target_logit_impl(logits, targets, target_logit, shape);
}

void vocab_parallel_cross_entropy_rescale_sum_exp(const float* local_max,
                                                  const double* local_sum_exp, const float* row_max,
                                                  float* sum_exp, int64_t rows) {
  // Tested on the sum, not the max: where it is 0 (ignored row, no classes here) the maxima may
  // both be -inf, whose difference is NaN.
  for (int64_t r = 0; r < rows; ++r)
    sum_exp[r] =
        local_sum_exp[r] == 0.0
            ? 0.0f
            : float(local_sum_exp[r] * std::exp(double(local_max[r]) - double(row_max[r])));
}

double vocab_parallel_cross_entropy_loss(const int32_t* targets, const float* row_max,
                                         const float* sum_exp, const float* target_logit,
                                         float* lse, const VocabParallelCrossEntropyShape& shape,
                                         int64_t* count) {
  return loss_impl(targets, row_max, sum_exp, target_logit, lse, shape, count);
}
double vocab_parallel_cross_entropy_loss(const int64_t* targets, const float* row_max,
                                         const float* sum_exp, const float* target_logit,
                                         float* lse, const VocabParallelCrossEntropyShape& shape,
                                         int64_t* count) {
  return loss_impl(targets, row_max, sum_exp, target_logit, lse, shape, count);
}

void vocab_parallel_cross_entropy_backward(const float* logits, const int32_t* targets,
                                           const float* lse, float scale, float* dlogits,
                                           const VocabParallelCrossEntropyShape& shape) {
  backward_impl(logits, targets, lse, scale, dlogits, shape);
}
void vocab_parallel_cross_entropy_backward(const float* logits, const int64_t* targets,
                                           const float* lse, float scale, float* dlogits,
                                           const VocabParallelCrossEntropyShape& shape) {
  backward_impl(logits, targets, lse, scale, dlogits, shape);
}

}  // namespace loom::kernels::cpu
