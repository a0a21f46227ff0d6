// Two-pass statistics (mean, then the mean of squared deviations) in f32: for rows the width of
// a transformer's channels this is as accurate as Welford. Row reductions go through Eigen
// arrays, which vectorise them (the compiler will not reorder a plain float sum).
//
// The parameter gradients sum over rows. Rows are cut into fixed chunks of kChunkRows; each
// chunk sums into its own partial row and the partials are added in chunk order, so dweight and
// dbias are bit-for-bit the same whatever the thread count.
#include "kernels/cpu/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>
#include "kernels/cpu/aligned_buffer.h"
#include "kernels/cpu/eigen.h"

namespace loom::kernels::cpu {

namespace {

constexpr int64_t kChunkRows = 32;

using Row = Eigen::Map<Eigen::ArrayXf>;
using ConstRow = Eigen::Map<const Eigen::ArrayXf>;

}  // namespace

void layer_norm_forward(const float* x, const float* weight, const float* bias, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  if (cols == 0) return;
  const float inv_cols = 1.0f / float(cols);
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    ConstRow xr(x + r * cols, cols);
    Row yr(y + r * cols, cols);
    const float m = xr.sum() * inv_cols;
    const float s = 1.0f / std::sqrt((xr - m).square().sum() * inv_cols + eps);
    mean[r] = m;
    rstd[r] = s;
    if (weight && bias)
      yr = (xr - m) * s * ConstRow(weight, cols) + ConstRow(bias, cols);
    else if (weight)
      yr = (xr - m) * s * ConstRow(weight, cols);
    else if (bias)
      yr = (xr - m) * s + ConstRow(bias, cols);
    else
      yr = (xr - m) * s;
  }
}

void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                         const float* dy, float* dx, float* dweight, float* dbias, int64_t rows,
                         int64_t cols) {
  if (cols == 0) return;
  const bool params = dweight || dbias;
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  // Per chunk: cols partial sums of dy * xhat, then cols of dy.
  AlignedVector<float> partial(params ? size_t(chunks * 2 * cols) : 0,
                               0.0f);  // Note [Aligned scratch]
  AlignedVector<float> ones(weight ? 0 : size_t(cols), 1.0f);
  ConstRow w(weight ? weight : ones.data(), cols);
  const float inv_cols = 1.0f / float(cols);
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t r_end = std::min(rows, (chunk + 1) * kChunkRows);
    for (int64_t r = chunk * kChunkRows; r < r_end; ++r) {
      ConstRow xr(x + r * cols, cols), dyr(dy + r * cols, cols);
      const float m = mean[r], s = rstd[r];
      if (params) {
        Row pw(partial.data() + chunk * 2 * cols, cols), pb(pw.data() + cols, cols);
        pw += dyr * (xr - m) * s;
        pb += dyr;
      }
      if (!dx) continue;
      // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight.
      const float mean_g = (dyr * w).sum() * inv_cols;
      const float mean_gx = (dyr * w * (xr - m)).sum() * s * inv_cols;
      Row dxr(dx + r * cols, cols);
      dxr = s * (dyr * w - mean_g - (xr - m) * (s * mean_gx));
    }
  }
  if (!params) return;
  Eigen::ArrayXf sum_w = Eigen::ArrayXf::Zero(cols), sum_b = Eigen::ArrayXf::Zero(cols);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    sum_w += ConstRow(partial.data() + chunk * 2 * cols, cols);
    sum_b += ConstRow(partial.data() + chunk * 2 * cols + cols, cols);
  }
  if (dweight) Row(dweight, cols) = sum_w;
  if (dbias) Row(dbias, cols) = sum_b;
}

}  // namespace loom::kernels::cpu
