// Row softmax on CUDA, the CPU's passes (kernels/cpu/softmax.cpp) in the same f32 formulas:
// m = max(x), e = exp(x - m), y = e * (1 / sum(e)); dx = y * (dy - sum(y * dy)). Keeping the
// CPU's formula, rather than an online (single-pass) max-and-sum, is what makes -inf entries and
// all -inf rows come out as on the CPU (0, and NaN) with no special cases.
//
// Each row belongs to one row group: a warp when cols <= kWarpRowMaxCols (8 rows per 256-thread
// block), else the whole block (a vocabulary row of 50304 is ~197 elements per thread). The group
// reads its row in 16-byte vectors when cols and every pointer allow, else one element per
// thread, and re-reads the row (from L1/L2) in each pass rather than holding it in registers, so
// one kernel is correct for every cols. exp is the accurate expf (not __expf), so GPU and CPU
// agree to f32 rounding. Partial results are combined in a fixed tree: deterministic.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/row_kernels.cuh"
#include "kernels/cuda/softmax.h"

namespace loom::kernels::cuda {

namespace {

using namespace detail;  // kernels/cuda/row_kernels.cuh: row groups, vectors, reductions

// ---------------------------------------------------------------- kernels

// Each element of y is written by the thread that read it in the last pass, after the row's max
// and sum are complete, so y == x is safe.
template <int kThreads, int V, typename T>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t rows, int64_t cols) {
  using G = RowGroup<kThreads>;
  __shared__ float scratch[kWarpsPerRowBlock];
  const int64_t step = int64_t(kThreads) * V;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const T* xr = x + r * cols;
    float acc = -INFINITY;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V];
      load<V>(xr + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) acc = fmaxf(acc, v[k]);
    }
    const float m = group_reduce<kThreads>(acc, scratch, ReduceMax{});
    acc = 0.0f;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V];
      load<V>(xr + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) acc += expf(v[k] - m);
    }
    const float inv_sum = 1.0f / group_reduce<kThreads>(acc, scratch, ReduceSum{});
    T* yr = y + r * cols;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V];
      load<V>(xr + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = expf(v[k] - m) * inv_sum;
      store<V>(yr + c, v);
    }
  }
}

template <int kThreads, int V, typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t rows,
                                        int64_t cols) {
  using G = RowGroup<kThreads>;
  __shared__ float scratch[kWarpsPerRowBlock];
  const int64_t step = int64_t(kThreads) * V;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    float acc = 0.0f;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float a[V], d[V];
      load<V>(yr + c, a);
      load<V>(dyr + c, d);
#pragma unroll
      for (int k = 0; k < V; ++k) acc += a[k] * d[k];
    }
    const float dot = group_reduce<kThreads>(acc, scratch, ReduceSum{});
    T* dxr = dx + r * cols;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float a[V], d[V];
      load<V>(yr + c, a);
      load<V>(dyr + c, d);
#pragma unroll
      for (int k = 0; k < V; ++k) d[k] = a[k] * (d[k] - dot);
      store<V>(dxr + c, d);
    }
  }
}

// ---------------------------------------------------------------- launchers

template <int kThreads, int V, typename T>
void launch_forward(const T* x, T* y, int64_t rows, int64_t cols, Stream stream) {
  auto softmax_forward_rows = softmax_forward_kernel<kThreads, V, T>;
  LOOM_LAUNCH(softmax_forward_rows, RowGroup<kThreads>::grid(rows), kRowBlock, 0, stream, x, y,
              rows, cols);
}

template <int kThreads, int V, typename T>
void launch_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, Stream stream) {
  auto softmax_backward_rows = softmax_backward_kernel<kThreads, V, T>;
  LOOM_LAUNCH(softmax_backward_rows, RowGroup<kThreads>::grid(rows), kRowBlock, 0, stream, y, dy,
              dx, rows, cols);
}

template <typename T>
void forward(const T* x, T* y, int64_t rows, int64_t cols, Stream stream) {
  if (rows == 0 || cols == 0) return;
  dispatch_rows<T>(cols, aligned16(x) && aligned16(y), [&](auto threads, auto vec) {
    launch_forward<decltype(threads)::value, decltype(vec)::value>(x, y, rows, cols, stream);
  });
}

template <typename T>
void backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, Stream stream) {
  if (rows == 0 || cols == 0) return;
  const bool aligned = aligned16(y) && aligned16(dy) && aligned16(dx);
  dispatch_rows<T>(cols, aligned, [&](auto threads, auto vec) {
    launch_backward<decltype(threads)::value, decltype(vec)::value>(y, dy, dx, rows, cols, stream);
  });
}

}  // namespace

void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols, Stream stream) {
  forward(x, y, rows, cols, stream);
}
void softmax_forward(const BFloat16* x, BFloat16* y, int64_t rows, int64_t cols, Stream stream) {
  forward(x, y, rows, cols, stream);
}

void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                      Stream stream) {
  backward(y, dy, dx, rows, cols, stream);
}
void softmax_backward(const BFloat16* y, const BFloat16* dy, BFloat16* dx, int64_t rows,
                      int64_t cols, Stream stream) {
  backward(y, dy, dx, rows, cols, stream);
}

}  // namespace loom::kernels::cuda
