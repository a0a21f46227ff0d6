// Layer norm on CUDA, the CPU's passes (kernels/cpu/layer_norm.cpp) in the same f32 formulas.
//
// Rows. Each row belongs to one row group: a warp when cols <= kWarpRowMaxCols (8 rows per
// 256-thread block; GPT-2's 768 columns are 24 per lane), else the whole block. The group reads
// its row in 16-byte vectors when cols and every pointer allow, else one element per thread, and
// makes the CPU's passes: the mean, then the mean of squared deviations, then the output. Each
// pass re-reads the row (from L1/L2) rather than holding it in registers, so one kernel is correct
// for every cols. Partial sums are combined in a fixed tree, so results are deterministic.
//
// Parameter gradients. dweight and dbias sum over rows. Rows are cut into chunks (kMinChunkRows
// rows at least, kMaxChunks chunks at most); one thread per (column, chunk) adds its chunk's rows
// in row order into the workspace, then one thread per column adds the chunks' partials in chunk
// order. Both orders are fixed by the shape, so the results are bit-identical from run to run
// (no atomics). This pass re-reads x and dy, which keeps the dx kernel a plain row kernel.
#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/layer_norm.h"
#include "kernels/cuda/row_kernels.cuh"

namespace loom::kernels::cuda {

namespace {

using namespace detail;  // kernels/cuda/row_kernels.cuh: row groups, vectors, reductions

// The parameter-gradient chunks: see the top of the file.
constexpr int64_t kMinChunkRows = 32;
constexpr int64_t kMaxChunks = 1024;

// ---------------------------------------------------------------- kernels

// See kernels/cpu/layer_norm.cpp: m = sum(x) / cols, s = 1 / sqrt(sum((x - m)^2) / cols + eps),
// y = (x - m) * s * w + b. Each element of y is written by the thread that read it in the last
// pass, after the row's statistics are complete, so y == x is safe.
template <int kThreads, int V, typename T>
__global__ void layer_norm_forward_kernel(const T* x, const float* weight, const float* bias, T* y,
                                          float* mean, float* rstd, int64_t rows, int64_t cols,
                                          float eps) {
  using G = RowGroup<kThreads>;
  __shared__ float scratch[kWarpsPerRowBlock];
  const float inv_cols = 1.0f / float(cols);
  const int64_t step = int64_t(kThreads) * V;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const T* xr = x + r * cols;
    float acc = 0.0f;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V];
      load<V>(xr + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) acc += v[k];
    }
    const float m = group_reduce<kThreads>(acc, scratch, ReduceSum{}) * inv_cols;
    acc = 0.0f;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V];
      load<V>(xr + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) acc += (v[k] - m) * (v[k] - m);
    }
    const float s =
        1.0f / sqrtf(group_reduce<kThreads>(acc, scratch, ReduceSum{}) * inv_cols + eps);
    if (G::rank() == 0) {
      mean[r] = m;
      rstd[r] = s;
    }
    T* yr = y + r * cols;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V], w[V], b[V], out[V];
      load<V>(xr + c, v);
      load_or<V>(weight ? weight + c : nullptr, 1.0f, w);
      load_or<V>(bias ? bias + c : nullptr, 0.0f, b);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = (v[k] - m) * s * w[k] + b[k];
      store<V>(yr + c, out);
    }
  }
}

// dx = s * (g - mean(g) - (x - m) * s * mean(g * (x - m)) * s) with g = dy * w, as the CPU's.
template <int kThreads, int V, typename T>
__global__ void layer_norm_backward_dx_kernel(const T* x, const float* weight, const float* mean,
                                              const float* rstd, const T* dy, T* dx, int64_t rows,
                                              int64_t cols) {
  using G = RowGroup<kThreads>;
  __shared__ float scratch[kWarpsPerRowBlock];
  const float inv_cols = 1.0f / float(cols);
  const int64_t step = int64_t(kThreads) * V;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    const float m = mean[r], s = rstd[r];
    float acc_g = 0.0f, acc_gx = 0.0f;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V], d[V], w[V];
      load<V>(xr + c, v);
      load<V>(dyr + c, d);
      load_or<V>(weight ? weight + c : nullptr, 1.0f, w);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        acc_g += d[k] * w[k];
        acc_gx += d[k] * w[k] * (v[k] - m);
      }
    }
    const float mean_g = group_reduce<kThreads>(acc_g, scratch, ReduceSum{}) * inv_cols;
    const float mean_gx = group_reduce<kThreads>(acc_gx, scratch, ReduceSum{}) * s * inv_cols;
    T* dxr = dx + r * cols;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V], d[V], w[V], out[V];
      load<V>(xr + c, v);
      load<V>(dyr + c, d);
      load_or<V>(weight ? weight + c : nullptr, 1.0f, w);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = s * (d[k] * w[k] - mean_g - (v[k] - m) * (s * mean_gx));
      store<V>(dxr + c, out);
    }
  }
}

// partial[(2 * chunk) * cols + c] = sum over the chunk's rows of dy * (x - m) * s, and
// partial[(2 * chunk + 1) * cols + c] = sum of dy, in row order. Grid: (column blocks, chunks).
template <typename T>
__global__ void layer_norm_param_partials_kernel(const T* x, const float* mean, const float* rstd,
                                                 const T* dy, float* partial, int64_t rows,
                                                 int64_t cols, int64_t chunk_rows) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t chunk = blockIdx.y;
  const int64_t r_begin = chunk * chunk_rows;
  const int64_t r_end = r_begin + chunk_rows < rows ? r_begin + chunk_rows : rows;
  float sum_w = 0.0f, sum_b = 0.0f;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float d = to_float(dy[r * cols + c]);
    sum_w += d * (to_float(x[r * cols + c]) - mean[r]) * rstd[r];
    sum_b += d;
  }
  partial[(2 * chunk) * cols + c] = sum_w;
  partial[(2 * chunk + 1) * cols + c] = sum_b;
}

// dweight[c], dbias[c] (each may be null) = the chunks' partials added in chunk order; zeros when
// there are no chunks (rows == 0), as on the CPU.
__global__ void layer_norm_param_finish_kernel(const float* partial, float* dweight, float* dbias,
                                               int64_t chunks, int64_t cols) {
  LOOM_GRID_STRIDE(c, cols) {
    float sum_w = 0.0f, sum_b = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) {
      sum_w += partial[(2 * k) * cols + c];
      sum_b += partial[(2 * k + 1) * cols + c];
    }
    if (dweight) dweight[c] = sum_w;
    if (dbias) dbias[c] = sum_b;
  }
}

// ---------------------------------------------------------------- launchers

struct ParamChunks {
  int64_t chunk_rows = kMinChunkRows, chunks = 0;
};

ParamChunks param_chunks(int64_t rows) {
  ParamChunks p;
  const int64_t spread = (rows + kMaxChunks - 1) / kMaxChunks;
  if (spread > p.chunk_rows) p.chunk_rows = spread;
  p.chunks = (rows + p.chunk_rows - 1) / p.chunk_rows;
  return p;
}

template <int kThreads, int V, typename T>
void launch_forward(const T* x, const float* weight, const float* bias, T* y, float* mean,
                    float* rstd, int64_t rows, int64_t cols, float eps, Stream stream) {
  auto layer_norm_forward_rows = layer_norm_forward_kernel<kThreads, V, T>;
  LOOM_LAUNCH(layer_norm_forward_rows, RowGroup<kThreads>::grid(rows), kRowBlock, 0, stream, x,
              weight, bias, y, mean, rstd, rows, cols, eps);
}

template <int kThreads, int V, typename T>
void launch_backward_dx(const T* x, const float* weight, const float* mean, const float* rstd,
                        const T* dy, T* dx, int64_t rows, int64_t cols, Stream stream) {
  auto layer_norm_backward_dx_rows = layer_norm_backward_dx_kernel<kThreads, V, T>;
  LOOM_LAUNCH(layer_norm_backward_dx_rows, RowGroup<kThreads>::grid(rows), kRowBlock, 0, stream, x,
              weight, mean, rstd, dy, dx, rows, cols);
}

template <typename T>
void forward(const T* x, const float* weight, const float* bias, T* y, float* mean, float* rstd,
             int64_t rows, int64_t cols, float eps, Stream stream) {
  if (rows == 0 || cols == 0) return;
  LOOM_CHECK(mean && rstd, "layer_norm_forward: mean and rstd must not be null (",
             mean ? "rstd" : "mean", " is)");
  const bool aligned = aligned16(x) && aligned16(y) && aligned16(weight) && aligned16(bias);
  dispatch_rows<T>(cols, aligned, [&](auto threads, auto vec) {
    launch_forward<decltype(threads)::value, decltype(vec)::value>(x, weight, bias, y, mean, rstd,
                                                                   rows, cols, eps, stream);
  });
}

template <typename T>
void backward(const T* x, const float* weight, const float* mean, const float* rstd, const T* dy,
              T* dx, float* dweight, float* dbias, int64_t rows, int64_t cols, void* workspace,
              size_t workspace_bytes, Stream stream) {
  if (cols == 0) return;
  const bool params = dweight || dbias;
  if (params) {
    const size_t need = layer_norm_backward_workspace_bytes(rows, cols);
    LOOM_CHECK(workspace_bytes >= need, "layer_norm_backward: workspace of ", workspace_bytes,
               " bytes is too small for rows ", rows, ", cols ", cols, ": needs ", need,
               " bytes (layer_norm_backward_workspace_bytes)");
    LOOM_CHECK(need == 0 || workspace != nullptr, "layer_norm_backward: workspace is null but ",
               need, " bytes are needed for dweight/dbias");
    LOOM_CHECK(reinterpret_cast<uintptr_t>(workspace) % alignof(float) == 0,
               "layer_norm_backward: workspace must be ", alignof(float), "-byte aligned");
  }
  if (rows > 0 && (dx || params))
    LOOM_CHECK(mean && rstd, "layer_norm_backward: mean and rstd must not be null (",
               mean ? "rstd" : "mean", " is)");
  if (dx && rows > 0) {
    const bool aligned = aligned16(x) && aligned16(dy) && aligned16(dx) && aligned16(weight);
    dispatch_rows<T>(cols, aligned, [&](auto threads, auto vec) {
      launch_backward_dx<decltype(threads)::value, decltype(vec)::value>(x, weight, mean, rstd, dy,
                                                                         dx, rows, cols, stream);
    });
  }
  if (!params) return;
  const ParamChunks p = param_chunks(rows);
  float* partial = static_cast<float*>(workspace);
  if (p.chunks > 0) {
    const dim3 grid(blocks_for(cols, kRowBlock), unsigned(p.chunks));
    auto layer_norm_param_partials = layer_norm_param_partials_kernel<T>;
    LOOM_LAUNCH(layer_norm_param_partials, grid, kRowBlock, 0, stream, x, mean, rstd, dy, partial,
                rows, cols, p.chunk_rows);
  }
  LOOM_LAUNCH(layer_norm_param_finish_kernel, grid_stride_blocks(cols), kRowBlock, 0, stream,
              partial, dweight, dbias, p.chunks, cols);
}

}  // namespace

size_t layer_norm_backward_workspace_bytes(int64_t rows, int64_t cols) {
  return size_t(param_chunks(rows).chunks) * 2 * size_t(cols) * sizeof(float);
}

void layer_norm_forward(const float* x, const float* weight, const float* bias, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                        Stream stream) {
  forward(x, weight, bias, y, mean, rstd, rows, cols, eps, stream);
}

void layer_norm_forward(const BFloat16* x, const float* weight, const float* bias, BFloat16* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                        Stream stream) {
  forward(x, weight, bias, y, mean, rstd, rows, cols, eps, stream);
}

void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                         const float* dy, float* dx, float* dweight, float* dbias, int64_t rows,
                         int64_t cols, void* workspace, size_t workspace_bytes, Stream stream) {
  backward(x, weight, mean, rstd, dy, dx, dweight, dbias, rows, cols, workspace, workspace_bytes,
           stream);
}

void layer_norm_backward(const BFloat16* x, const float* weight, const float* mean,
                         const float* rstd, const BFloat16* dy, BFloat16* dx, float* dweight,
                         float* dbias, int64_t rows, int64_t cols, void* workspace,
                         size_t workspace_bytes, Stream stream) {
  backward(x, weight, mean, rstd, dy, dx, dweight, dbias, rows, cols, workspace, workspace_bytes,
           stream);
}

}  // namespace loom::kernels::cuda
