// Loops on host memory. The loss sums in double over fixed chunks (see the header); the
// gradient is elementwise.
#include "kernels/cpu/binary_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace loom::kernels::cpu {

namespace {

constexpr int64_t kChunk = 4096;  // elements per partial sum; fixed, so sums are reproducible

}  // namespace

double binary_cross_entropy_forward(const float* logits, const float* targets, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double s = 0.0;
    for (int64_t i = c * kChunk; i < end; ++i) {
      const double x = logits[i], y = targets[i];
      s += std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::fabs(x)));
    }
    partial[size_t(c)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

void binary_cross_entropy_backward(const float* logits, const float* targets, float scale,
                                   float* dlogits, float* dtargets, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const float p = 1.0f / (1.0f + std::exp(-logits[i]));
    dlogits[i] = scale * (p - targets[i]);
  }
  if (dtargets == nullptr) return;
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dtargets[i] = -scale * logits[i];
}

}  // namespace loom::kernels::cpu
