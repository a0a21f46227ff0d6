// Dot-interaction kernels (the CPU twin is kernels/cpu/dot_interaction.cpp). Both are grid-stride
// loops over their outputs with no shared memory and no inter-thread communication:
// - forward: a thread per (b, pair); the pair index p is inverted to (i, j) with a square root
//   and then corrected by exact integer tests, so rounding in sqrt cannot pick the wrong row;
//   the dot adds in eight lanes exactly as the CPU's `dot` does. Threads of a warp read the same
//   row i and neighbouring rows j of one sample, which stay in L1.
// - backward: a thread per (b, i, d) of dx, walking j ascending; neighbouring threads read
//   neighbouring d, so the reads of x are coalesced.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/dot_interaction.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kLanes = 8;

__device__ inline int64_t pair_index(int64_t i, int64_t j) { return i * (i - 1) / 2 + j; }

// The row i of pair p: the largest i with i*(i-1)/2 <= p (then j = p - i*(i-1)/2 < i).
__device__ inline int64_t pair_row(int64_t p) {
  int64_t i = int64_t((1.0 + sqrt(1.0 + 8.0 * double(p))) * 0.5);
  while (i > 1 && i * (i - 1) / 2 > p) --i;
  while ((i + 1) * i / 2 <= p) ++i;
  return i;
}

// The CPU's `dot`: lanes l = d mod 8 for whole groups of eight, the tail in lanes 0, 1, ...,
// combined as ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)).
__device__ inline float dot(const float* a, const float* b, int64_t n) {
  float lane[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {
#pragma unroll
    for (int l = 0; l < kLanes; ++l) lane[l] += a[d + l] * b[d + l];
  }
#pragma unroll
  for (int l = 0; l < kLanes; ++l)
    if (d + l < n) lane[l] += a[d + l] * b[d + l];
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

__global__ void dot_interaction_forward_kernel(const float* x, float* out, int64_t batch,
                                               int64_t features, int64_t dim, int64_t pairs) {
  LOOM_GRID_STRIDE(e, batch * pairs) {
    const int64_t b = e / pairs, p = e % pairs;
    const int64_t i = pair_row(p), j = p - i * (i - 1) / 2;
    const float* xb = x + b * features * dim;
    out[e] = dot(xb + i * dim, xb + j * dim, dim);
  }
}

__global__ void dot_interaction_backward_kernel(const float* x, const float* dout, float* dx,
                                                int64_t batch, int64_t features, int64_t dim,
                                                int64_t pairs) {
  LOOM_GRID_STRIDE(e, batch * features * dim) {
    const int64_t d = e % dim, bi = e / dim;
    const int64_t i = bi % features, b = bi / features;
    const float* xb = x + b * features * dim;
    const float* g = dout + b * pairs;
    float acc = 0.0f;
    for (int64_t j = 0; j < features; ++j) {
      if (j == i) continue;
      const float w = g[i > j ? pair_index(i, j) : pair_index(j, i)];
      acc += w * xb[j * dim + d];
    }
    dx[e] = acc;
  }
}

void check_sizes(const char* fn, int64_t batch, int64_t features, int64_t dim) {
  LOOM_CHECK(batch >= 0 && features >= 0 && dim >= 0, "cuda ", fn, ": sizes batch ", batch,
             ", features ", features, ", dim ", dim, " must not be negative");
}

}  // namespace

void dot_interaction_forward(const float* x, float* out, int64_t batch, int64_t features,
                             int64_t dim, Stream stream) {
  check_sizes("dot_interaction_forward", batch, features, dim);
  const int64_t pairs = features * (features - 1) / 2;
  const int64_t n = batch * pairs;
  if (n == 0) return;
  LOOM_LAUNCH(dot_interaction_forward_kernel, grid_stride_blocks(n), kBlockThreads, 0, stream, x,
              out, batch, features, dim, pairs);
}

void dot_interaction_backward(const float* x, const float* dout, float* dx, int64_t batch,
                              int64_t features, int64_t dim, Stream stream) {
  check_sizes("dot_interaction_backward", batch, features, dim);
  const int64_t pairs = features * (features - 1) / 2;
  const int64_t n = batch * features * dim;
  if (n == 0) return;
  LOOM_LAUNCH(dot_interaction_backward_kernel, grid_stride_blocks(n), kBlockThreads, 0, stream, x,
              dout, dx, batch, features, dim, pairs);
}

}  // namespace loom::kernels::cuda
