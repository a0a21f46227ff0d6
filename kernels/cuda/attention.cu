// Flash-style attention (FlashAttention-2's algorithm) with plain f32 FMA loops over shared
// memory; the semantics are kernels/cpu/attention.cpp's (layout [BH, T, D], scores
// (scale * q) k^T with scale = 1/sqrt(D), lse = max + log(sum), the same causal mask).
//
// Note [Attention tiles]
// Every kernel works on tiles of kTile = 32 rows of one head, 32 being the warp size, with 4 warps
// per block. Inside a tile pair (32 query rows x 32 keys) each warp owns 8 rows of the tile its
// block keeps, and its lanes index the 32 rows of the other tile: a lane computes 8 dot products
// over the head dim (its own row of one tile against the warp's 8 rows of the other), so row-wise
// softmax statistics are warp reductions and nothing of the [T, T] scores is ever stored. The
// products that follow (P V, P^T dO, dS^T Q, dS K) switch the lanes to head-dim columns
// c = lane + 32 * n and take the other operand from its owner lane with a shuffle; each warp
// accumulates its 8 output rows in registers (kD / 32 columns per lane, kD the head dim rounded
// up to 32, 64 or 128). Tiles past T are zero rows whose scores are masked, so they add nothing.
//
// Shared tiles read by a whole warp at one address (broadcast) have pitch d; tiles whose row a
// lane picks have an odd pitch d | 1, so 32 lanes reading one column hit 32 different banks.
//
// Backward, deterministic (no atomics): delta[i] = rowsum(dout * out) first (the CPU's
// rowsum(P * dP) shortcut), then one block per (head, key tile) looping over query tiles to form
// dK and dV, and one block per (head, query tile) looping over key tiles to form dQ, both
// recomputing P = exp(s - lse). The recompute costs one extra pass and buys a fixed summation
// order with each output written by exactly one block.
//
// Shared memory: the forward keeps two tiles, at most 32 * (2d + 1) floats (32.1 KiB at d = 128).
// Each backward kernel keeps four, at most 64 * (2d + 2) floats (64.5 KiB at d = 128); from d = 96
// on that passes the default 48 KiB, so those launches opt in with cudaFuncSetAttribute first
// (H100 allows 227 KiB per block).
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kWarpSize = 32;
constexpr int kTile = kWarpSize;  // rows of a query or key tile: See Note [Attention tiles]
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRowsPerWarp = kTile / kWarps;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kMaxHeadDim = 128;
constexpr size_t kDefaultSharedBytes = 48 * 1024;
static_assert(kTile % kWarps == 0, "each warp owns kTile / kWarps rows of a tile");

int64_t odd_pitch(int64_t d) { return d | 1; }
size_t forward_shared_bytes(int64_t d) {
  return sizeof(float) * size_t(kTile * (d + odd_pitch(d)));
}
size_t backward_shared_bytes(int64_t d) {
  return sizeof(float) * size_t(2 * kTile * (d + odd_pitch(d)) + 2 * kTile);
}
static_assert(sizeof(float) * kTile * (kMaxHeadDim + (kMaxHeadDim | 1)) <= kDefaultSharedBytes,
              "the forward stays within the default 48 KiB of shared memory");

int64_t tiles_for(int64_t t) { return (t + kTile - 1) / kTile; }

// ---------------------------------------------------------------- device helpers

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(BFloat16 x) { return bf16_to_float(x); }
__device__ inline void store(float* p, float x) { *p = x; }
__device__ inline void store(BFloat16* p, float x) { *p = float_to_bf16(x); }  // nearest even

// Butterfly reductions: every lane ends with the same value, in an order fixed by the lane ids.
__device__ inline float warp_sum(float x) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) x += __shfl_xor_sync(kFullMask, x, off);
  return x;
}
__device__ inline float warp_max(float x) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}

// Rows [row0, row0 + kTile) of one head's [t, d] matrix, times scale, into dst (row r at
// dst + r * pitch, pitch >= d); rows at or past t become zeros. The tile is contiguous in global
// memory, so consecutive threads read consecutive elements. All threads of the block take part.
template <typename T>
__device__ void load_tile(float* dst, int pitch, const T* src, int64_t row0, int64_t t, int d,
                          float scale) {
  const int64_t rows = t - row0 < kTile ? t - row0 : kTile;
  const T* tile = src + row0 * d;
  for (int e = threadIdx.x; e < kTile * d; e += blockDim.x) {
    const int r = e / d, c = e - r * d;
    dst[r * pitch + c] = r < rows ? to_float(tile[e]) * scale : 0.0f;
  }
}

// The per-row values [row0, row0 + kTile) of one head's [t] array; zeros past t.
__device__ void load_rows(float* dst, const float* src, int64_t row0, int64_t t) {
  for (int r = threadIdx.x; r < kTile; r += blockDim.x)
    dst[r] = row0 + r < t ? src[row0 + r] : 0.0f;
}

// Key j is visible from query i.
__device__ inline bool visible(int64_t i, int64_t j, int64_t t, bool causal) {
  return i < t && j < t && (!causal || j <= i);
}

// ---------------------------------------------------------------- forward

// One block per (head, query tile); grid = bh * tiles, the heaviest (last) causal tiles first.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, int64_t t,
                             int d, int64_t tiles, bool causal, float scale) {
  constexpr int kCols = kD / kWarpSize;  // head-dim columns per lane
  extern __shared__ float smem[];
  const int qp = d, kp = d | 1;
  float* qs = smem;              // [kTile][qp] scale * this block's queries (broadcast reads)
  float* kvs = qs + kTile * qp;  // [kTile][kp] the current key tile, then its value tile
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t head = blockIdx.x / tiles;
  const int64_t q0 = (tiles - 1 - blockIdx.x % tiles) * kTile;
  const int64_t base = head * t * d;
  const int r0 = warp * kRowsPerWarp;  // the warp's first row in the tile
  load_tile(qs, qp, q + base, q0, t, d, scale);

  // Online softmax state of the warp's rows: running max m, running sum l, unnormalised o.
  float o[kRowsPerWarp][kCols], m[kRowsPerWarp], l[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int n = 0; n < kCols; ++n) o[rr][n] = 0.0f;
  }

  // Causal: key tiles wholly above the diagonal are skipped; the diagonal tile is masked.
  const int64_t kv_end = causal && q0 + kTile < t ? q0 + kTile : t;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kTile) {
    __syncthreads();  // qs is loaded, and no warp still reads the previous value tile
    load_tile(kvs, kp, k + base, k0, t, d, 1.0f);
    __syncthreads();
    // Scores: lane = key k0 + lane, against the warp's 8 query rows.
    float s[kRowsPerWarp] = {};
    for (int c = 0; c < d; ++c) {
      const float kc = kvs[lane * kp + c];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) s[rr] += qs[(r0 + rr) * qp + c] * kc;
    }
    float p[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const bool seen = visible(q0 + r0 + rr, k0 + lane, t, causal);
      const float sv = seen ? s[rr] : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(sv));
      const float shift = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: no NaN
      p[rr] = seen ? expf(sv - shift) : 0.0f;
      const float alpha = expf(m[rr] - shift);  // rescales the old state to the new max
      l[rr] = l[rr] * alpha + warp_sum(p[rr]);
      m[rr] = m_new;
#pragma unroll
      for (int n = 0; n < kCols; ++n) o[rr][n] *= alpha;
    }
    __syncthreads();  // no warp still reads the key tile
    load_tile(kvs, kp, v + base, k0, t, d, 1.0f);
    __syncthreads();
    // o += P V: lane = column c, P[row][j] from lane j.
    for (int j = 0; j < kTile; ++j) {
      float vj[kCols];
#pragma unroll
      for (int n = 0; n < kCols; ++n) {
        const int c = lane + n * kWarpSize;
        vj[n] = c < d ? kvs[j * kp + c] : 0.0f;
      }
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float pj = __shfl_sync(kFullMask, p[rr], j);
#pragma unroll
        for (int n = 0; n < kCols; ++n) o[rr][n] += pj * vj[n];
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = q0 + r0 + rr;
    if (i >= t) continue;  // l > 0 here: key 0 is visible from every row
    const float inv = 1.0f / l[rr];
#pragma unroll
    for (int n = 0; n < kCols; ++n) {
      const int c = lane + n * kWarpSize;
      if (c < d) store(out + base + i * d + c, o[rr][n] * inv);
    }
    if (lane == 0) lse[head * t + i] = m[rr] + logf(l[rr]);
  }
}

// ---------------------------------------------------------------- backward

// delta[row] = sum_c dout[row, c] * out[row, c], a warp per row, in a fixed order.
template <typename T>
__global__ void attention_delta_kernel(const T* out, const T* dout, float* delta, int64_t rows,
                                       int d) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
       row < rows; row += warps) {  // row is the same for the whole warp
    float acc = 0.0f;
    for (int c = lane; c < d; c += kWarpSize)
      acc += to_float(dout[row * d + c]) * to_float(out[row * d + c]);
    acc = warp_sum(acc);
    if (lane == 0) delta[row] = acc;
  }
}

// dK and dV: one block per (head, key tile), looping over the query tiles that see it;
// grid = bh * tiles, the heaviest (first) causal key tiles first.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(const T* q, const T* k, const T* v, const float* lse,
                                   const float* delta, const T* dout, T* dk, T* dv, int64_t t,
                                   int d, int64_t tiles, bool causal, float scale) {
  constexpr int kCols = kD / kWarpSize;
  extern __shared__ float smem[];
  const int kp = d, qp = d | 1;
  float* ks = smem;                 // [kTile][kp] this block's keys (broadcast reads)
  float* vs = ks + kTile * kp;      // [kTile][kp] this block's values (broadcast reads)
  float* qs = vs + kTile * kp;      // [kTile][qp] scale * the current query tile
  float* dos = qs + kTile * qp;     // [kTile][qp] its output gradient
  float* lse_s = dos + kTile * qp;  // [kTile] its lse
  float* delta_s = lse_s + kTile;   // [kTile] its delta
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t head = blockIdx.x / tiles;
  const int64_t k0 = (blockIdx.x % tiles) * kTile;
  const int64_t base = head * t * d;
  const int j0 = warp * kRowsPerWarp;  // the warp's first key in the tile
  load_tile(ks, kp, k + base, k0, t, d, 1.0f);
  load_tile(vs, kp, v + base, k0, t, d, 1.0f);

  float dk_acc[kRowsPerWarp][kCols], dv_acc[kRowsPerWarp][kCols];
#pragma unroll
  for (int jj = 0; jj < kRowsPerWarp; ++jj)
#pragma unroll
    for (int n = 0; n < kCols; ++n) dk_acc[jj][n] = dv_acc[jj][n] = 0.0f;

  // Causal: queries before k0 see none of these keys (q0 = k0 is a tile boundary).
  for (int64_t q0 = causal ? k0 : 0; q0 < t; q0 += kTile) {
    __syncthreads();  // ks, vs are loaded, and no warp still reads the previous query tile
    load_tile(qs, qp, q + base, q0, t, d, scale);
    load_tile(dos, qp, dout + base, q0, t, d, 1.0f);
    load_rows(lse_s, lse + head * t, q0, t);
    load_rows(delta_s, delta + head * t, q0, t);
    __syncthreads();
    // S and dP = dO V^T: lane = query q0 + lane, against the warp's 8 keys.
    float s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
    for (int c = 0; c < d; ++c) {
      const float qc = qs[lane * qp + c], doc = dos[lane * qp + c];
#pragma unroll
      for (int jj = 0; jj < kRowsPerWarp; ++jj) {
        s[jj] += qc * ks[(j0 + jj) * kp + c];
        dp[jj] += doc * vs[(j0 + jj) * kp + c];
      }
    }
    // P = exp(S - lse) and dS = P * (dP - delta); zero where masked.
    float p[kRowsPerWarp], ds[kRowsPerWarp];
#pragma unroll
    for (int jj = 0; jj < kRowsPerWarp; ++jj) {
      const bool seen = visible(q0 + lane, k0 + j0 + jj, t, causal);
      p[jj] = seen ? expf(s[jj] - lse_s[lane]) : 0.0f;
      ds[jj] = p[jj] * (dp[jj] - delta_s[lane]);
    }
    // dV += P^T dO, dK += dS^T (scale Q): lane = column c, P[i][j] and dS[i][j] from lane i.
    for (int i = 0; i < kTile; ++i) {
      float qi[kCols], doi[kCols];
#pragma unroll
      for (int n = 0; n < kCols; ++n) {
        const int c = lane + n * kWarpSize;
        qi[n] = c < d ? qs[i * qp + c] : 0.0f;
        doi[n] = c < d ? dos[i * qp + c] : 0.0f;
      }
#pragma unroll
      for (int jj = 0; jj < kRowsPerWarp; ++jj) {
        const float pij = __shfl_sync(kFullMask, p[jj], i);
        const float dsij = __shfl_sync(kFullMask, ds[jj], i);
#pragma unroll
        for (int n = 0; n < kCols; ++n) {
          dv_acc[jj][n] += pij * doi[n];
          dk_acc[jj][n] += dsij * qi[n];
        }
      }
    }
  }

#pragma unroll
  for (int jj = 0; jj < kRowsPerWarp; ++jj) {
    const int64_t j = k0 + j0 + jj;
    if (j >= t) continue;
#pragma unroll
    for (int n = 0; n < kCols; ++n) {
      const int c = lane + n * kWarpSize;
      if (c < d) {
        store(dk + base + j * d + c, dk_acc[jj][n]);
        store(dv + base + j * d + c, dv_acc[jj][n]);
      }
    }
  }
}

// dQ: one block per (head, query tile), looping over the key tiles it sees; grid = bh * tiles,
// the heaviest (last) causal query tiles first.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(const T* q, const T* k, const T* v, const float* lse,
                                 const float* delta, const T* dout, T* dq, int64_t t, int d,
                                 int64_t tiles, bool causal, float scale) {
  constexpr int kCols = kD / kWarpSize;
  extern __shared__ float smem[];
  const int qp = d, kp = d | 1;
  float* qs = smem;                // [kTile][qp] scale * this block's queries (broadcast reads)
  float* dos = qs + kTile * qp;    // [kTile][qp] their output gradient (broadcast reads)
  float* ks = dos + kTile * qp;    // [kTile][kp] the current key tile
  float* vs = ks + kTile * kp;     // [kTile][kp] its values
  float* lse_s = vs + kTile * kp;  // [kTile] this block's lse
  float* delta_s = lse_s + kTile;  // [kTile] this block's delta
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t head = blockIdx.x / tiles;
  const int64_t q0 = (tiles - 1 - blockIdx.x % tiles) * kTile;
  const int64_t base = head * t * d;
  const int r0 = warp * kRowsPerWarp;
  load_tile(qs, qp, q + base, q0, t, d, scale);
  load_tile(dos, qp, dout + base, q0, t, d, 1.0f);
  load_rows(lse_s, lse + head * t, q0, t);
  load_rows(delta_s, delta + head * t, q0, t);

  float acc[kRowsPerWarp][kCols];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
    for (int n = 0; n < kCols; ++n) acc[rr][n] = 0.0f;

  const int64_t kv_end = causal && q0 + kTile < t ? q0 + kTile : t;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kTile) {
    __syncthreads();  // the query side is loaded, and no warp still reads the previous key tile
    load_tile(ks, kp, k + base, k0, t, d, 1.0f);
    load_tile(vs, kp, v + base, k0, t, d, 1.0f);
    __syncthreads();
    // S and dP = dO V^T: lane = key k0 + lane, against the warp's 8 query rows.
    float s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
    for (int c = 0; c < d; ++c) {
      const float kc = ks[lane * kp + c], vc = vs[lane * kp + c];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        s[rr] += qs[(r0 + rr) * qp + c] * kc;
        dp[rr] += dos[(r0 + rr) * qp + c] * vc;
      }
    }
    float ds[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const bool seen = visible(q0 + r0 + rr, k0 + lane, t, causal);
      const float p = seen ? expf(s[rr] - lse_s[r0 + rr]) : 0.0f;
      ds[rr] = p * (dp[rr] - delta_s[r0 + rr]);
    }
    // dQ += dS K: lane = column c, dS[i][j] from lane j.
    for (int j = 0; j < kTile; ++j) {
      float kj[kCols];
#pragma unroll
      for (int n = 0; n < kCols; ++n) {
        const int c = lane + n * kWarpSize;
        kj[n] = c < d ? ks[j * kp + c] : 0.0f;
      }
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float dsij = __shfl_sync(kFullMask, ds[rr], j);
#pragma unroll
        for (int n = 0; n < kCols; ++n) acc[rr][n] += dsij * kj[n];
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = q0 + r0 + rr;
    if (i >= t) continue;
#pragma unroll
    for (int n = 0; n < kCols; ++n) {
      const int c = lane + n * kWarpSize;
      if (c < d) store(dq + base + i * d + c, scale * acc[rr][n]);
    }
  }
}

// ---------------------------------------------------------------- launchers

float scale_for(int64_t d) { return d > 0 ? 1.0f / std::sqrt(float(d)) : 1.0f; }

void check_sizes(const char* op, int64_t bh, int64_t t, int64_t d) {
  LOOM_CHECK(bh >= 0 && t >= 0 && d >= 0, "cuda ", op, ": negative size (bh = ", bh, ", t = ", t,
             ", d = ", d, ")");
  LOOM_CHECK(d <= kMaxHeadDim, "cuda ", op, ": head dim d = ", d,
             " exceeds attention_max_head_dim() = ", kMaxHeadDim);
  const int64_t tiles = tiles_for(t), max_blocks = std::numeric_limits<int32_t>::max();
  LOOM_CHECK(tiles == 0 || bh <= max_blocks / tiles, "cuda ", op, ": bh = ", bh, " heads x ", tiles,
             " tiles of ", kTile, " rows is more than 2^31-1 blocks (split the batch)");
}

// A kernel whose dynamic shared memory passes the default 48 KiB has to opt in first.
template <typename Kernel>
void allow_shared_bytes(Kernel* kernel, size_t bytes) {
  if (bytes > kDefaultSharedBytes)
    LOOM_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Calls f with the head-dim bucket kD (32, 64 or 128) that holds d as a compile-time constant.
template <typename F>
void with_head_dim_bucket(int64_t d, F&& f) {
  static_assert(kMaxHeadDim == 128, "add a bucket for a larger max head dim");
  if (d <= 32)
    f(std::integral_constant<int, 32>());
  else if (d <= 64)
    f(std::integral_constant<int, 64>());
  else
    f(std::integral_constant<int, 128>());
}

template <typename T>
void forward(const T* q, const T* k, const T* v, T* out, float* lse, int64_t bh, int64_t t,
             int64_t d, bool causal, Stream stream) {
  check_sizes("attention_forward", bh, t, d);
  if (bh == 0 || t == 0) return;
  const int64_t tiles = tiles_for(t);
  const unsigned blocks = unsigned(bh * tiles);
  const size_t shared = forward_shared_bytes(d);
  with_head_dim_bucket(d, [&](auto bucket) {
    auto attention_forward_tile = attention_forward_kernel<T, decltype(bucket)::value>;
    LOOM_LAUNCH(attention_forward_tile, blocks, kThreads, shared, stream, q, k, v, out, lse, t,
                int(d), tiles, causal, scale_for(d));
  });
}

template <typename T>
void backward(const T* q, const T* k, const T* v, const T* out, const float* lse, const T* dout,
              T* dq, T* dk, T* dv, int64_t bh, int64_t t, int64_t d, bool causal, void* workspace,
              size_t workspace_bytes, Stream stream) {
  check_sizes("attention_backward", bh, t, d);
  const size_t need = attention_backward_workspace_bytes(bh, t, d);
  LOOM_CHECK(workspace_bytes >= need &&
                 (need == 0 || (workspace != nullptr &&
                                reinterpret_cast<uintptr_t>(workspace) % alignof(float) == 0)),
             "cuda attention_backward: workspace of ", workspace_bytes, " bytes at ", workspace,
             ", needs ", need, " bytes, 4-byte aligned (attention_backward_workspace_bytes)");
  // d = 0: dq, dk and dv have no elements.
  if (bh == 0 || t == 0 || d == 0) return;

  float* delta = static_cast<float*>(workspace);  // [bh, t]: rowsum(dout * out)
  const int64_t rows = bh * t;
  constexpr int kDeltaWarps = kBlockThreads / kWarpSize;
  const int64_t delta_blocks = (rows + kDeltaWarps - 1) / kDeltaWarps;
  auto attention_delta = attention_delta_kernel<T>;
  LOOM_LAUNCH(attention_delta,
              unsigned(delta_blocks < kMaxGridBlocks ? delta_blocks : kMaxGridBlocks),
              kBlockThreads, 0, stream, out, dout, delta, rows, int(d));

  const int64_t tiles = tiles_for(t);
  const unsigned blocks = unsigned(bh * tiles);
  const size_t shared = backward_shared_bytes(d);
  const float scale = scale_for(d);
  with_head_dim_bucket(d, [&](auto bucket) {
    constexpr int kD = decltype(bucket)::value;
    auto attention_backward_dkdv = attention_backward_dkdv_kernel<T, kD>;
    allow_shared_bytes(attention_backward_dkdv, shared);
    LOOM_LAUNCH(attention_backward_dkdv, blocks, kThreads, shared, stream, q, k, v, lse, delta,
                dout, dk, dv, t, int(d), tiles, causal, scale);
    auto attention_backward_dq = attention_backward_dq_kernel<T, kD>;
    allow_shared_bytes(attention_backward_dq, shared);
    LOOM_LAUNCH(attention_backward_dq, blocks, kThreads, shared, stream, q, k, v, lse, delta, dout,
                dq, t, int(d), tiles, causal, scale);
  });
}

}  // namespace

int64_t attention_max_head_dim() { return kMaxHeadDim; }

size_t attention_backward_workspace_bytes(int64_t bh, int64_t t, int64_t /*d*/) {
  return bh > 0 && t > 0 ? size_t(bh) * size_t(t) * sizeof(float) : 0;
}

void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                       int64_t bh, int64_t t, int64_t d, bool causal, Stream stream) {
  forward(q, k, v, out, lse, bh, t, d, causal, stream);
}

void attention_forward(const BFloat16* q, const BFloat16* k, const BFloat16* v, BFloat16* out,
                       float* lse, int64_t bh, int64_t t, int64_t d, bool causal, Stream stream) {
  forward(q, k, v, out, lse, bh, t, d, causal, stream);
}

void attention_backward(const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv,
                        int64_t bh, int64_t t, int64_t d, bool causal, void* workspace,
                        size_t workspace_bytes, Stream stream) {
  backward(q, k, v, out, lse, dout, dq, dk, dv, bh, t, d, causal, workspace, workspace_bytes,
           stream);
}

void attention_backward(const BFloat16* q, const BFloat16* k, const BFloat16* v,
                        const BFloat16* out, const float* lse, const BFloat16* dout, BFloat16* dq,
                        BFloat16* dk, BFloat16* dv, int64_t bh, int64_t t, int64_t d, bool causal,
                        void* workspace, size_t workspace_bytes, Stream stream) {
  backward(q, k, v, out, lse, dout, dq, dk, dv, bh, t, d, causal, workspace, workspace_bytes,
           stream);
}

}  // namespace loom::kernels::cuda
