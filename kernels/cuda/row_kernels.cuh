// The row machinery layer_norm.cu and softmax.cu share (internal; include only from .cu files):
// row groups (a warp or a block per row), 16-byte vector loads and stores that convert to and
// from f32, and the group reduction. Both kernels make the CPU's passes over a row, re-reading it
// in each pass, and combine partial results in the fixed tree of group_reduce, so results are
// bit-identical from run to run.
//
// The names avoid those of the other detail headers (embedding_bag_impl.cuh has its own to_f32,
// group_sum and kBlock), so any .cu may include more than one of them.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/launch.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda::detail {

constexpr int kWarp = 32;
constexpr int kRowBlock = kBlockThreads;  // threads per block of the row kernels
constexpr int kWarpsPerRowBlock = kRowBlock / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kRowBlock % kWarp == 0, "a block is whole warps");
// Rows up to this many columns get a warp each; longer rows get a block.
constexpr int64_t kWarpRowMaxCols = 1024;

// ---------------------------------------------------------------- elements and vectors

// Elements per 16-byte vector: 4 f32 or 8 bf16.
template <typename T>
constexpr int kVec = 16 / int(sizeof(T));

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T e[N];
};

__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(BFloat16 v) { return bf16_to_float(v); }
__device__ inline void from_float(float& d, float v) { d = v; }
__device__ inline void from_float(BFloat16& d, float v) { d = float_to_bf16(v); }  // RNE

// Accesses of V elements are split into accesses of at most 16 bytes; p must be aligned to the
// access size (min(16, V * sizeof(T)) bytes), which the launchers check before choosing V > 1.
template <int V, typename T>
constexpr int access_elems() {
  return V * int(sizeof(T)) > 16 ? 16 / int(sizeof(T)) : V;
}

// v[k] = p[k] for k < V, as f32.
template <int V, typename T>
__device__ inline void load(const T* p, float (&v)[V]) {
  constexpr int N = access_elems<V, T>();
  static_assert(V % N == 0, "whole accesses");
#pragma unroll
  for (int k = 0; k < V; k += N) {
    const Pack<T, N> pk = *reinterpret_cast<const Pack<T, N>*>(p + k);
#pragma unroll
    for (int j = 0; j < N; ++j) v[k + j] = to_float(pk.e[j]);
  }
}

// As load, or `fill` in every element when p is null (an absent weight or bias).
template <int V>
__device__ inline void load_or(const float* p, float fill, float (&v)[V]) {
  if (p) {
    load<V>(p, v);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = fill;
  }
}

// p[k] = v[k] for k < V, each rounded once to T.
template <int V, typename T>
__device__ inline void store(T* p, const float (&v)[V]) {
  constexpr int N = access_elems<V, T>();
  static_assert(V % N == 0, "whole accesses");
#pragma unroll
  for (int k = 0; k < V; k += N) {
    Pack<T, N> pk;
#pragma unroll
    for (int j = 0; j < N; ++j) from_float(pk.e[j], v[k + j]);
    *reinterpret_cast<Pack<T, N>*>(p + k) = pk;
  }
}

// ---------------------------------------------------------------- row groups

// The threads that share one row: a warp (kThreads == kWarp, kWarpsPerRowBlock rows per block)
// or the whole block (kThreads == kRowBlock). All threads of a group visit the same rows in the
// same order, so each reaches every reduction of its group (shuffles for a warp, __syncthreads
// for a block); a warp's lanes past the row's end take part with neutral values.
template <int kThreads>
struct RowGroup {
  static_assert(kThreads == kWarp || kThreads == kRowBlock, "a row group is a warp or a block");
  static constexpr int kRowsPerBlock = kRowBlock / kThreads;
  __device__ static int rank() { return int(threadIdx.x) % kThreads; }
  __device__ static int64_t first_row() {
    return int64_t(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kThreads;
  }
  __device__ static int64_t row_stride() { return int64_t(gridDim.x) * kRowsPerBlock; }
  static unsigned grid(int64_t rows) { return grid_stride_blocks(rows, kRowsPerBlock); }
};

struct ReduceSum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct ReduceMax {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// op over the calling thread's row group, returned to every thread of it: a butterfly over the
// warp (each step's partners combine the same two numbers, so all lanes agree), then, for a
// block, the warps' results combined in warp order. scratch: kWarpsPerRowBlock floats of shared
// memory.
template <int kThreads, typename Op>
__device__ inline float group_reduce(float v, float* scratch, Op op) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, o));
  if constexpr (kThreads == kWarp) {
    return v;
  } else {
    if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
    __syncthreads();
    float total = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarpsPerRowBlock; ++w) total = op(total, scratch[w]);
    __syncthreads();  // scratch is written again by the group's next reduction
    return total;
  }
}

// ---------------------------------------------------------------- launch helpers

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls f(kThreads, V) as integral constants: the row group for cols, and 16-byte vectors when
// cols is a whole number of them and `aligned` (every row pointer on a 16-byte boundary).
template <typename T, typename F>
void dispatch_rows(int64_t cols, bool aligned, F&& f) {
  using Warp = std::integral_constant<int, kWarp>;
  using Block = std::integral_constant<int, kRowBlock>;
  using One = std::integral_constant<int, 1>;
  using Vec = std::integral_constant<int, kVec<T> >;
  const bool vec = aligned && cols % kVec<T> == 0;
  if (cols <= kWarpRowMaxCols) {
    if (vec) return f(Warp{}, Vec{});
    return f(Warp{}, One{});
  }
  if (vec) return f(Block{}, Vec{});
  return f(Block{}, One{});
}

}  // namespace loom::kernels::cuda::detail
