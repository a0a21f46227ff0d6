// Internals shared by the CUDA cross-entropy kernels (cross_entropy.cu and
// vocab_parallel_cross_entropy.cu), the twin of kernels/cpu/cross_entropy_impl.h: f32 / bf16
// element access, block reductions in a fixed order, and the two row launchers both losses use
// (defined in cross_entropy.cu). Not part of the kernel interface.
//
// Note [CUDA cross-entropy rows]
// A row of logits is read by one block (up to kMaxRowThreads threads striding its columns; a
// grid-stride loop over rows). The forward makes one pass: each thread keeps an online max m and
// s = sum of exp(x - m) over its columns (exp in f32, s in double, rescaled by exp(m_old - m_new)
// when the max grows); the block then takes the max M of the m's and sums s * exp(m - M) in
// double over its threads, in warp order. The backward recomputes exp(x - lse) element by element,
// as the CPU does. Every reduction adds in an order fixed by the shape, so results are
// bit-identical from run to run.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda::detail {

// Threads of a row block (a multiple of 32), and of the one-block kernels that sum over rows.
constexpr int kMaxRowThreads = 512;
constexpr int kSumThreads = 1024;
constexpr int kMaxWarps = 32;  // per block, at most
static_assert(kMaxRowThreads % 32 == 0 && kSumThreads % 32 == 0 && kSumThreads / 32 <= kMaxWarps,
              "whole warps, at most kMaxWarps of them");

// Threads for a row block over n columns: n rounded up to whole warps, at most kMaxRowThreads.
inline int row_block_threads(int64_t n) {
  const int64_t warps = n < 1 ? 1 : (n + 31) / 32;
  return warps * 32 < kMaxRowThreads ? int(warps * 32) : kMaxRowThreads;
}

// One block per row up to the grid cap; the kernels loop over the rest.
inline unsigned row_blocks(int64_t rows) {
  return unsigned(rows < int64_t(kMaxGridBlocks) ? (rows < 1 ? 1 : rows) : kMaxGridBlocks);
}

// ---- f32 / bf16 elements (bf16 rounded to nearest even, as kernels/numeric.h) ----

__device__ inline float as_f32(float x) { return x; }
__device__ inline float as_f32(BFloat16 x) { return bf16_to_float(x); }
__device__ inline void store_rounded(float v, float* p) { *p = v; }
__device__ inline void store_rounded(float v, BFloat16* p) { *p = float_to_bf16(v); }

// ---- block reductions: blockDim.x a multiple of 32, at most kMaxWarps warps; every thread of
// the block must call them; the result is in every thread ----

// scratch: kMaxWarps floats of shared memory.
__device__ inline float block_max(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warps = int(blockDim.x) / 32;
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch[w]);
  __syncthreads();  // scratch is free for the next reduction
  return m;
}

// T = double or long long; scratch: kMaxWarps of T in shared memory. The warps' sums are added in
// warp order, the same in every thread.
template <typename T>
__device__ inline T block_sum(T v, T* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warps = int(blockDim.x) / 32;
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  T total = scratch[0];
  for (int w = 1; w < warps; ++w) total += scratch[w];
  __syncthreads();  // scratch is free for the next reduction
  return total;
}

// ---- the row launchers (cross_entropy.cu; T in {float, BFloat16}, I in {int32_t, int64_t}) ----

// For each row r of logits [rows, cols] whose target is not ignore_index: M = the max of columns
// [0, classes) and S = the sum of exp(x - M) over them in double (See Note [CUDA cross-entropy
// rows]); writes those of the outputs that are not null: lse[r] = float(M + log(S)),
// row_max[r] = M, row_sum_exp[r] = S. Ignored rows get lse 0, row_max -inf, row_sum_exp 0; with
// no classes M is -inf and S 0. Nothing is launched when rows is 0.
template <typename T, typename I>
void launch_row_stats(const T* logits, const I* targets, int64_t rows, int64_t cols,
                      int64_t classes, int64_t ignore_index, float* lse, float* row_max,
                      double* row_sum_exp, Stream stream);

// Writes (=) dlogits [rows, cols]: for rows whose target is not ignore_index, columns
// c < classes get exp(x - lse[r]) * *scale, less *scale where c == target - target_offset, and
// columns [classes, cols) get 0; ignored rows get 0. Nothing is launched when rows * cols is 0.
template <typename T, typename I>
void launch_row_backward(const T* logits, const I* targets, const float* lse, const float* scale,
                         T* dlogits, int64_t rows, int64_t cols, int64_t classes,
                         int64_t target_offset, int64_t ignore_index, Stream stream);

}  // namespace loom::kernels::cuda::detail
