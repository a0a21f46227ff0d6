// Eigen arrays give the row loops a vectorised exp (scalar expf would dominate); rows are
// independent, so OpenMP splits them.
#include "kernels/cpu/softmax.h"

#include "kernels/cpu/eigen.h"

namespace loom::kernels::cpu {

namespace {

using Row = Eigen::Map<Eigen::ArrayXf>;
using ConstRow = Eigen::Map<const Eigen::ArrayXf>;

}  // namespace

void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) {
  if (cols == 0) return;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    ConstRow xr(x + r * cols, cols);
    Row yr(y + r * cols, cols);
    const float m = xr.maxCoeff();
    yr = (xr - m).exp();
    yr *= 1.0f / yr.sum();
  }
}

void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
  if (cols == 0) return;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    ConstRow yr(y + r * cols, cols), dyr(dy + r * cols, cols);
    Row dxr(dx + r * cols, cols);
    const float dot = (yr * dyr).sum();
    dxr = yr * (dyr - dot);
  }
}

}  // namespace loom::kernels::cpu
