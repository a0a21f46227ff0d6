// The rows' max, sum of exponentials and gradient come from cross_entropy_impl.h, shared with the
// vocab-parallel kernels (see Note [Summing a row's exponentials] there). Per-row losses are added
// in row order, so the result does not depend on the thread count.
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cross_entropy_impl.h"

namespace loom::kernels::cpu {

namespace {

// log(sum(exp(x[0, n)))) with the max subtracted first so no term overflows.
double log_sum_exp(const float* x, int64_t n) {
  const float m = detail::row_max(x, n);
  return double(m) + std::log(detail::row_sum_exp(x, n, m));
}

template <typename I>
double forward_impl(const float* logits, const I* targets, float* lse,
                    const CrossEntropyShape& shape, int64_t* count) {
  const int64_t rows = shape.rows, cols = shape.cols;
  std::vector<double> row_loss(size_t(rows), 0.0);
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t target = int64_t(targets[r]);
    if (target == shape.ignore_index) {
      lse[r] = 0.0f;
      continue;
    }
    const float* x = logits + r * cols;
    const double l = log_sum_exp(x, shape.num_classes);
    lse[r] = float(l);
    row_loss[size_t(r)] = l - double(x[target]);
  }
  double total = 0.0;
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (int64_t(targets[r]) == shape.ignore_index) continue;
    total += row_loss[size_t(r)];
    ++counted;
  }
  *count = counted;
  return total;
}

template <typename I>
void backward_impl(const float* logits, const I* targets, const float* lse, float scale,
                   float* dlogits, const CrossEntropyShape& shape) {
  const int64_t rows = shape.rows, cols = shape.cols, classes = shape.num_classes;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dlogits + r * cols;
    const int64_t target = int64_t(targets[r]);
    if (target == shape.ignore_index) {
      std::fill(d, d + cols, 0.0f);
      continue;
    }
    detail::row_cross_entropy_grad(logits + r * cols, cols, classes, target, lse[r], scale, d);
  }
}

}  // namespace

double cross_entropy_forward(const float* logits, const int32_t* targets, float* lse,
                             const CrossEntropyShape& shape, int64_t* count) {
  return forward_impl(logits, targets, lse, shape, count);
}
double cross_entropy_forward(const float* logits, const int64_t* targets, float* lse,
                             const CrossEntropyShape& shape, int64_t* count) {
  return forward_impl(logits, targets, lse, shape, count);
}

void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse,
                            float scale, float* dlogits, const CrossEntropyShape& shape) {
  backward_impl(logits, targets, lse, scale, dlogits, shape);
}
void cross_entropy_backward(const float* logits, const int64_t* targets, const float* lse,
                            float scale, float* dlogits, const CrossEntropyShape& shape) {
  backward_impl(logits, targets, lse, scale, dlogits, shape);
}

}  // namespace loom::kernels::cpu
