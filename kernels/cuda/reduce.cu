// Three ways to reduce, picked by shape so every case has enough threads and coalesced reads:
// - many outputs with inner > 1 (a sum over a leading dim): one thread per output, walking the
//   reduced dim; neighbouring threads read neighbouring addresses;
// - a few outputs or inner == 1 (a sum over the last dim): one block per output, its threads
//   striding the reduced dim, partials combined in shared memory;
// - one huge output (a sum over everything): per-block partials in f64, then one block adds them.
// Every path adds in an order fixed by the shape and launch sizes, so results are deterministic.
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.h"
#include "kernels/extreme.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;
constexpr unsigned kMaxBlocks = kMaxGridBlocks;
// Below this many outputs a thread per output leaves most of the GPU idle.
constexpr int64_t kThreadPerOutputMin = 4096;
// A single sum over more elements than this gets the two-pass treatment.
constexpr int64_t kTwoPassMin = int64_t(1) << 16;
constexpr unsigned kPartials = 1024;

// Sums buf[0..kBlock) into buf[0]; the calling block's threads must all take part.
__device__ double block_sum(double* buf, double v) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  return buf[0];
}

__global__ void sum_thread_per_output(const float* x, float* out, int64_t outer, int64_t size,
                                      int64_t inner, double scale) {
  const int64_t outputs = outer * inner;
  LOOM_GRID_STRIDE(j, outputs) {
    const int64_t o = j / inner, i = j % inner;
    const float* p = x + o * size * inner + i;
    double acc = 0.0;
    for (int64_t r = 0; r < size; ++r) acc += double(p[r * inner]);
    out[j] = float(acc * scale);
  }
}

__global__ void sum_block_per_output(const float* x, float* out, int64_t outer, int64_t size,
                                     int64_t inner, double scale) {
  __shared__ double buf[kBlock];
  const int64_t outputs = outer * inner;
  for (int64_t j = blockIdx.x; j < outputs; j += gridDim.x) {
    const int64_t o = j / inner, i = j % inner;
    const float* p = x + o * size * inner + i;
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < size; r += blockDim.x) acc += double(p[r * inner]);
    const double total = block_sum(buf, acc);
    if (threadIdx.x == 0) out[j] = float(total * scale);
    __syncthreads();  // buf is reused by the next output
  }
}

__global__ void sum_partials(const float* x, int64_t n, double* partial) {
  __shared__ double buf[kBlock];
  double acc = 0.0;
  LOOM_GRID_STRIDE(i, n)
  acc += double(x[i]);
  const double total = block_sum(buf, acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void sum_finish(const double* partial, int count, float* out, double scale) {
  __shared__ double buf[kBlock];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  const double total = block_sum(buf, acc);
  if (threadIdx.x == 0) out[0] = float(total * scale);
}

__global__ void broadcast_kernel(const float* g, float* out, int64_t outer, int64_t size,
                                 int64_t inner, float scale) {
  const int64_t n = outer * size * inner;
  LOOM_GRID_STRIDE(j, n) {
    const int64_t o = j / (size * inner), i = j % inner;
    out[j] = g[o * inner + i] * scale;
  }
}

}  // namespace

void sum_dim(const float* x, float* out, int64_t outer, int64_t size, int64_t inner, double scale,
             Stream stream) {
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  if (outputs == 1 && size >= kTwoPassMin) {
    const unsigned blocks =
        grid_stride_blocks(size) < kPartials ? grid_stride_blocks(size) : kPartials;
    double* partial = nullptr;
    LOOM_CUDA_CHECK(cudaMallocAsync(&partial, blocks * sizeof(double), stream));
    LOOM_LAUNCH(sum_partials, blocks, kBlock, 0, stream, x, size, partial);
    LOOM_LAUNCH(sum_finish, 1, kBlock, 0, stream, partial, int(blocks), out, scale);
    LOOM_CUDA_CHECK(cudaFreeAsync(partial, stream));
    return;
  }
  if (inner > 1 && outputs >= kThreadPerOutputMin) {
    LOOM_LAUNCH(sum_thread_per_output, grid_stride_blocks(outputs), kBlock, 0, stream, x, out,
                outer, size, inner, scale);
    return;
  }
  const unsigned blocks = unsigned(outputs < kMaxBlocks ? outputs : kMaxBlocks);
  LOOM_LAUNCH(sum_block_per_output, blocks, kBlock, 0, stream, x, out, outer, size, inner, scale);
}

void broadcast_dim(const float* g, float* out, int64_t outer, int64_t size, int64_t inner,
                   float scale, Stream stream) {
  const int64_t n = outer * size * inner;
  if (n == 0) return;
  LOOM_LAUNCH(broadcast_kernel, grid_stride_blocks(n), kBlock, 0, stream, g, out, outer, size,
              inner, scale);
}

namespace {

// One thread per output, walking its `size` candidates in order (the rule: kernels/extreme.h).
__global__ void extreme_kernel(const float* x, float* values, int64_t* indices, int64_t outer,
                               int64_t size, int64_t inner, bool largest) {
  LOOM_GRID_STRIDE(j, outer * inner) {
    const int64_t o = j / inner, i = j % inner;
    const float* xo = x + o * size * inner + i;
    float best = xo[0];
    int64_t at = 0;
    for (int64_t r = 1; r < size; ++r) {
      const float v = xo[r * inner];
      if (replaces(v, best, largest)) {
        best = v;
        at = r;
      }
    }
    values[j] = best;
    indices[j] = at;
  }
}

// One thread per column, k passes: pass j picks the first candidate in topk's order
// (kernels/extreme.h ranks_before) among those after pass j-1's pick, so no scratch memory is
// needed. O(k * size) per column: simple rather than fast, meant for sampling's top-k of a few
// rows, not for large k.
__global__ void topk_kernel(const float* x, float* values, int64_t* indices, int64_t outer,
                            int64_t size, int64_t inner, int64_t k, bool largest) {
  LOOM_GRID_STRIDE(column, outer * inner) {
    const int64_t o = column / inner, i = column % inner;
    const float* xs = x + o * size * inner + i;
    float prev = 0.0f;
    int64_t prev_at = -1;
    for (int64_t j = 0; j < k; ++j) {
      float best = 0.0f;
      int64_t at = -1;
      for (int64_t r = 0; r < size; ++r) {
        const float v = xs[r * inner];
        if (prev_at >= 0 && !ranks_before(prev, prev_at, v, r, largest)) continue;  // taken
        if (at < 0 || ranks_before(v, r, best, at, largest)) {
          best = v;
          at = r;
        }
      }
      values[(o * k + j) * inner + i] = best;
      indices[(o * k + j) * inner + i] = at;
      prev = best;
      prev_at = at;
    }
  }
}

__global__ void scatter_kernel(const float* g, const int64_t* indices, float* out, int64_t outer,
                               int64_t size, int64_t inner, int64_t k) {
  LOOM_GRID_STRIDE(at, outer * k * inner) {
    const int64_t o = at / (k * inner), i = at % inner;
    out[(o * size + indices[at]) * inner + i] = g[at];
  }
}

}  // namespace

void extreme_dim(const float* x, float* values, int64_t* indices, int64_t outer, int64_t size,
                 int64_t inner, bool largest, Stream stream) {
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  LOOM_LAUNCH(extreme_kernel, grid_stride_blocks(outputs), kBlock, 0, stream, x, values, indices,
              outer, size, inner, largest);
}

void topk_dim(const float* x, float* values, int64_t* indices, int64_t outer, int64_t size,
              int64_t inner, int64_t k, bool largest, Stream stream) {
  const int64_t columns = outer * inner;
  if (columns == 0 || k == 0) return;
  LOOM_LAUNCH(topk_kernel, grid_stride_blocks(columns), kBlock, 0, stream, x, values, indices,
              outer, size, inner, k, largest);
}

void scatter_dim(const float* g, const int64_t* indices, float* out, int64_t outer, int64_t size,
                 int64_t inner, int64_t k, Stream stream) {
  const int64_t n = outer * size * inner;
  if (n == 0) return;
  LOOM_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(n) * sizeof(float), stream));
  if (k == 0) return;
  LOOM_LAUNCH(scatter_kernel, grid_stride_blocks(outer * k * inner), kBlock, 0, stream, g, indices,
              out, outer, size, inner, k);
}

}  // namespace loom::kernels::cuda
