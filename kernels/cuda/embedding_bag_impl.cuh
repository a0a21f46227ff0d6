// Internals shared by the CUDA embedding-bag forward (embedding_bag.cu) and backward
// (embedding_bag_backward.cu): weight-dtype dispatch, 16-byte loads and stores of f32 / bf16 / f16
// rows, thread-group shuffles, the bounds-check rule, and the per-table prefix sums. Not part of
// the kernel interface.
//
// Note [Embedding row alignment]
// Tables may start at any element offset (weight_offsets is free), and a bf16 row of a dim that
// is 4 mod 8 is only 8-byte aligned, so every vector access checks its address: 16-byte (or
// 8-byte for four 16-bit values) accesses where the address allows, scalar ones otherwise. The
// check is the same for all lanes of a row, so it costs an integer test and never diverges.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/embedding_bag.h"
#include "kernels/cuda/launch.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda::detail {

constexpr int kBlock = kBlockThreads;

// Calls f(W{}) with W the C++ type of the weights' dtype (as the CPU kernels do).
template <typename F>
decltype(auto) dispatch_dtype(EmbeddingDType dtype, F&& f) {
  switch (dtype) {
    case EmbeddingDType::kBF16:
      return f(BFloat16{});
    case EmbeddingDType::kF16:
      return f(Float16{});
    case EmbeddingDType::kF32:
      break;
  }
  return f(float{});
}

// Calls f(std::integral_constant<int, S>, std::integral_constant<int, kChunks>) for a thread
// group of S lanes, each covering kChunks vectors of `per_lane` elements per pass over a row, for
// rows of up to max_dim elements (0: unknown). S is the smallest of 4, 8, 16, 32 that covers such
// a row in one pass with one vector per lane; rows wider than a warp's vectors get 4 per lane, so
// a 512-wide f32 row is still one pass. Narrower rows keep one, so fewer registers are reserved
// (an f32 S = 32 forward uses 80 registers with 4 chunks).
template <typename F>
void dispatch_group(int64_t max_dim, int per_lane, F&& f) {
  using One = std::integral_constant<int, 1>;
  const int64_t lanes = max_dim > 0 ? (max_dim + per_lane - 1) / per_lane : 33;
  if (lanes <= 4) return f(std::integral_constant<int, 4>{}, One{});
  if (lanes <= 8) return f(std::integral_constant<int, 8>{}, One{});
  if (lanes <= 16) return f(std::integral_constant<int, 16>{}, One{});
  if (lanes <= 32) return f(std::integral_constant<int, 32>{}, One{});
  return f(std::integral_constant<int, 32>{}, std::integral_constant<int, 4>{});
}

// ---- the bounds-check rule: see Note [Embedding bounds check] ----

__device__ inline bool is_bad_index(int64_t index, int64_t rows) {
  return static_cast<uint64_t>(index) >= static_cast<uint64_t>(rows);
}

// The row a lookup reads, or -1 for "contributes nothing" (kError skips too, defensively).
__device__ inline int64_t resolve_row(int64_t index, int64_t rows, EmbeddingBoundsCheck mode) {
  if (!is_bad_index(index, rows)) return index;
  return mode == EmbeddingBoundsCheck::kWarn && rows > 0 ? 0 : -1;
}

// ---- thread groups of S lanes (S divides 32) ----

// The lanes of the calling thread's group: shuffles name only them, so groups of one warp may
// run different loops (different bags) without waiting for each other.
template <int S>
__device__ inline unsigned group_mask() {
  static_assert(S == 4 || S == 8 || S == 16 || S == 32, "a group is 4, 8, 16 or 32 lanes");
  if constexpr (S == 32) {
    return 0xffffffffu;
  } else {
    return ((1u << S) - 1u) << ((threadIdx.x & 31u) & ~unsigned(S - 1));
  }
}

// The sum over the group, in every lane (a butterfly: each step adds the same two values in
// every lane, so every lane ends with the same bits).
template <int S, typename T>
__device__ inline T group_sum(unsigned mask, T v) {
#pragma unroll
  for (int o = S / 2; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o, S);
  return v;
}

// ---- element conversions ----

__device__ inline float to_f32(float x) { return x; }
__device__ inline float to_f32(BFloat16 x) { return __uint_as_float(uint32_t(x.bits) << 16); }
__device__ inline float to_f32(Float16 x) { return __half2float(__ushort_as_half(x.bits)); }

// Rounding as the CPU kernels round (numeric.h: nearest even, the same NaN).
__device__ inline void from_f32(float x, float* dst) { *dst = x; }
__device__ inline void from_f32(float x, BFloat16* dst) { *dst = float_to_bf16(x); }
__device__ inline void from_f32(float x, Float16* dst) { *dst = float_to_f16(x); }

// The low and high 16-bit values of a 32-bit word (little endian: element 0 is the low half).
__device__ inline float half_lo(uint32_t w, BFloat16) { return __uint_as_float(w << 16); }
__device__ inline float half_hi(uint32_t w, BFloat16) { return __uint_as_float(w & 0xffff0000u); }
__device__ inline float half_lo(uint32_t w, Float16) {
  return __half2float(__ushort_as_half(uint16_t(w & 0xffffu)));
}
__device__ inline float half_hi(uint32_t w, Float16) {
  return __half2float(__ushort_as_half(uint16_t(w >> 16)));
}

template <typename T>
__device__ inline bool aligned_to(const T* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// ---- vector loads and stores; see Note [Embedding row alignment] ----

// v[0, 4) = p[0, 4) in f32.
__device__ inline void load4(const float* p, float (&v)[4]) {
  if (aligned_to(p, 16)) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = p[e];
  }
}
template <typename W>
__device__ inline void load4(const W* p, float (&v)[4]) {
  static_assert(sizeof(W) == 2, "16-bit weights");
  if (aligned_to(p, 8)) {
    const uint2 x = *reinterpret_cast<const uint2*>(p);
    v[0] = half_lo(x.x, W{}), v[1] = half_hi(x.x, W{}), v[2] = half_lo(x.y, W{}),
    v[3] = half_hi(x.y, W{});
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = to_f32(p[e]);
  }
}

// v[0, kVec) = p[0, valid) in f32, zeros past valid; kVec = 16 / sizeof(W) (one 16-byte load
// when aligned), valid = kVec or (16-bit weights only) 4, the tail of a dim that is 4 mod 8.
template <typename W, int kVec>
__device__ inline void load_vec(const W* p, int64_t valid, float (&v)[kVec]) {
  static_assert(kVec * sizeof(W) == 16, "a lane's vector is 16 bytes");
  if constexpr (kVec == 4) {
    load4(p, v);
  } else {
    if (valid >= 8 && aligned_to(p, 16)) {
      const uint4 x = *reinterpret_cast<const uint4*>(p);
      const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) v[2 * i] = half_lo(w[i], W{}), v[2 * i + 1] = half_hi(w[i], W{});
      return;
    }
    float lo[4], hi[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    load4(p, lo);
    if (valid >= 8) load4(p + 4, hi);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = lo[e], v[4 + e] = hi[e];
  }
}

// p[0, 4) = v[0, 4).
__device__ inline void store4(float* p, const float (&v)[4]) {
  if (aligned_to(p, 16)) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = v[e];
  }
}
template <typename W>
__device__ inline void store4(W* p, const float (&v)[4]) {
  static_assert(sizeof(W) == 2, "16-bit weights");
  W h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) from_f32(v[e], &h[e]);
  if (aligned_to(p, 8)) {
    *reinterpret_cast<uint2*>(p) = make_uint2(uint32_t(h[0].bits) | (uint32_t(h[1].bits) << 16),
                                              uint32_t(h[2].bits) | (uint32_t(h[3].bits) << 16));
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = h[e];
  }
}

// p[0, valid) = v[0, valid), valid = kVec or 4 (see load_vec).
template <int kVec>
__device__ inline void store_vec(float* p, int64_t valid, const float (&v)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec / 4; ++i) {
    if (i > 0 && valid < 4 * (i + 1)) break;
    const float part[4] = {v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]};
    store4(p + 4 * i, part);
  }
}

// ---- per-table prefix sums (embedding_bag.cu) ----

// One block walks the T tables in order and writes, for each of the non-null outputs:
// row_base[T+1] (exclusive prefix of rows: where table t's rows start in one key space),
// packed[T+1] (where table t's block of the unpooled output starts; see Note [Embedding bag
// layout]) and first[T] (offsets[t*B], table t's first lookup).
template <typename Index>
void launch_table_prefix(const EmbeddingTables& tables, const Index* offsets, int64_t batch,
                         int64_t* row_base, int64_t* packed, int64_t* first, Stream stream);

}  // namespace loom::kernels::cuda::detail
