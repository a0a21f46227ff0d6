// Table-batched embedding-bag backward on CUDA: dense or sparse gradient, or a fused optimizer
// update that never materialises the weight gradient (the CPU twin is
// kernels/cpu/embedding_bag_backward.cpp).
//
// Note [Deterministic CUDA embedding backward]
// 1. Each lookup gets a key, table t's row r -> row_base[t] + r (skipped lookups: the total row
//    count, which sorts last and is dropped), and its position as the value.
// 2. cub::DeviceRadixSort::SortPairs sorts them. The sort is stable, so within one row the
//    positions stay in index order; its output does not depend on scheduling.
// 3. cub::DeviceRunLengthEncode finds the segments (runs of one key), a scan their starts.
// 4. Each segment is reduced by one owner that adds its lookups' output gradients in sorted
//    order: a group of S lanes (one 4-float column slice per lane) for segments of up to
//    kLongSegment lookups; a block for longer ones, its warps taking contiguous slices and their
//    partial rows added in warp order. No atomics touch values, and no two owners share a row, so
//    the bits are the same on every run. (They can differ from the CPU's by f32 rounding: a long
//    segment is summed in slices.)
// 5. The owner writes the row (dense, sparse) or applies the optimizer to it in place. Row-wise
//    Adagrad needs the whole row's sum of squares before it changes a weight; a row wider than one
//    pass is therefore reduced twice (the same order both times, so the same gradient).
//
// The one non-obvious decision: long segments are not known on the host, so the group kernel
// appends them to a list (an atomic counter; the list's order varies, but each long segment is
// reduced by one block in a fixed order, so the results do not), and the block kernel walks it.
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <cmath>
#include <limits>

#include "kernels/cuda/embedding_bag.h"
#include "kernels/cuda/embedding_bag_impl.cuh"

namespace loom::kernels::cuda {

namespace {

using detail::kBlock;

// Segments with more lookups go to a block (kBlock / 32 warps) instead of a group.
constexpr int32_t kLongSegment = 64;
constexpr int kWarps = kBlock / 32;
static_assert(kBlock % 32 == 0, "whole warps per block");

// ---------------------------------------------------------------- workspace

// The radix sort's end bit: keys are <= total_rows (the skipped key).
int sort_end_bit(const EmbeddingTablesInfo& info) {
  if (info.total_rows < 0) return 64;
  const int bits = embedding_bit_width(uint64_t(info.total_rows));
  return bits < 1 ? 1 : bits;
}

// Offsets into the workspace, each region 256-byte aligned. Region sizes depend on T, T*B and
// the number of lookups n only (and the sort's bits, through cub's scratch size).
struct Layout {
  size_t row_base, packed, first;  // int64 [T+1], [T+1], [T]
  size_t keys[2], pos[2];          // u64 [n] x2, int32 [n] x2 (the sort's double buffers)
  size_t bag_of, bag_scale;        // int32 [n], f32 [T*B]
  size_t unique_keys;              // u64 [n]
  size_t seg_len, seg_start;       // int32 [n] each
  size_t seg_table, seg_row;       // int32 [n], int64 [n]
  size_t counters;                 // int32 [3]: runs, segments, long segments
  size_t long_list;                // int32 [n / (kLongSegment + 1) + 1]
  size_t temp, temp_bytes;         // cub's scratch
  size_t total;
};

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

size_t cub_temp_bytes(int64_t n, int end_bit) {
  const int items = int(n);
  size_t bytes = 0, need = 0;
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> values(nullptr, nullptr);
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, need, keys, values, items, 0, end_bit));
  bytes = need > bytes ? need : bytes;
  LOOM_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(
      nullptr, need, static_cast<uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), items));
  bytes = need > bytes ? need : bytes;
  LOOM_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, need, static_cast<int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), items));
  bytes = need > bytes ? need : bytes;
  LOOM_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, need, static_cast<int64_t*>(nullptr),
                                                static_cast<int64_t*>(nullptr), items));
  return need > bytes ? need : bytes;
}

Layout make_layout(int64_t nt, int64_t bags, int64_t n, int end_bit) {
  Layout l{};
  size_t at_byte = 0;
  auto take = [&](size_t bytes) {
    const size_t offset = at_byte;
    at_byte += (bytes + 255) / 256 * 256;
    return offset;
  };
  const size_t un = size_t(n), ut = size_t(nt);
  l.row_base = take((ut + 1) * 8);
  l.packed = take((ut + 1) * 8);
  l.first = take(ut * 8 + 8);
  l.keys[0] = take(un * 8);
  l.keys[1] = take(un * 8);
  l.pos[0] = take(un * 4);
  l.pos[1] = take(un * 4);
  l.bag_of = take(un * 4);
  l.bag_scale = take(size_t(bags) * 4);
  l.unique_keys = take(un * 8);
  l.seg_len = take(un * 4);
  l.seg_start = take(un * 4);
  l.seg_table = take(un * 4);
  l.seg_row = take(un * 8);
  l.counters = take(3 * 4);
  l.long_list = take((un / (kLongSegment + 1) + 1) * 4);
  l.temp_bytes = n > 0 ? cub_temp_bytes(n, end_bit) : 0;
  l.temp = take(l.temp_bytes);
  l.total = at_byte;
  return l;
}

// ---------------------------------------------------------------- keys

// A warp per bag (grid-stride): every lookup's key, position and bag, and (mean) the bag's 1/count.
template <typename Index>
__global__ void __launch_bounds__(kBlock)
    keys_kernel(const int64_t* rows, const Index* indices, const Index* offsets, int64_t nt,
                int64_t batch, EmbeddingBoundsCheck mode, const int64_t* row_base, uint64_t* keys,
                int32_t* pos, int32_t* bag_of, float* bag_scale) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t bags = nt * batch, warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const uint64_t skipped = uint64_t(row_base[nt]);
  for (int64_t tb = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; tb < bags;
       tb += warps) {
    const int64_t t = tb / batch, table_rows = rows[t];
    const uint64_t base = uint64_t(row_base[t]);
    const int64_t begin = int64_t(offsets[tb]), end = int64_t(offsets[tb + 1]);
    int counted = 0;
    for (int64_t p = begin + lane; p < end; p += 32) {
      const int64_t r = detail::resolve_row(int64_t(indices[p]), table_rows, mode);
      keys[p] = r < 0 ? skipped : base + uint64_t(r);
      pos[p] = int32_t(p);
      bag_of[p] = int32_t(tb);
      counted += r >= 0;
    }
    if (bag_scale) {
      counted = detail::group_sum<32>(0xffffffffu, counted);
      if (lane == 0) bag_scale[tb] = counted > 0 ? 1.0f / float(counted) : 0.0f;
    }
  }
}

// ---------------------------------------------------------------- segments

// Per segment k: its table and row (and, for the sparse form, the output ids and the row width to
// scan into value_offsets). counters[0] = runs (from the encode); writes counters[1] = segments.
__global__ void segment_info_kernel(const uint64_t* unique_keys, const int32_t* counters_in,
                                    const int64_t* row_base, const int64_t* dims, int64_t nt,
                                    int64_t n, int32_t* num_segments, int32_t* seg_table,
                                    int64_t* seg_row, int64_t* num_unique, int64_t* sparse_tables,
                                    int64_t* sparse_rows, int64_t* seg_dim) {
  const int32_t runs = counters_in[0];
  const uint64_t skipped = uint64_t(row_base[nt]);
  const int32_t segments = runs > 0 && unique_keys[runs - 1] == skipped ? runs - 1 : runs;
  LOOM_GRID_STRIDE(k, n) {
    if (k == 0) {
      *num_segments = segments;
      if (num_unique) *num_unique = segments;
    }
    if (k >= segments) {
      if (seg_dim) seg_dim[k] = 0;  // so the scan of widths ends with the total
      continue;
    }
    const uint64_t key = unique_keys[k];
    int64_t lo = 0, hi = nt + 1;  // the last t with row_base[t] <= key (empty tables share it)
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (uint64_t(row_base[mid]) <= key)
        lo = mid + 1;
      else
        hi = mid;
    }
    const int64_t t = lo - 1, row = int64_t(key - uint64_t(row_base[t]));
    seg_table[k] = int32_t(t);
    seg_row[k] = row;
    if (sparse_tables) {
      sparse_tables[k] = t;
      sparse_rows[k] = row;
      seg_dim[k] = dims[t];
    }
  }
}

// ---------------------------------------------------------------- reduction and emission

enum class Emit : int8_t { kDense, kSparse, kUpdate };

struct SegmentArgs {
  EmbeddingTables tables;
  int64_t batch;
  EmbeddingPooling pooling;
  const float* dout;
  const float* psw;        // kSum only, else null
  const float* bag_scale;  // kMean only, else null
  const int64_t* packed;   // kNone only: table t's first element in dout
  const int64_t* first;    // kNone only: table t's first lookup
  const int32_t* pos;      // sorted positions
  const int32_t* bag_of;   // by position
  const int32_t* seg_start;
  const int32_t* seg_len;
  const int32_t* seg_table;
  const int64_t* seg_row;
  const int32_t* num_segments;
  int32_t* long_list;
  int32_t* long_count;
  Emit emit;
  float* grad_weights;           // kDense
  float* values;                 // kSparse
  const int64_t* value_offsets;  // kSparse
  void* weights;                 // kUpdate
  float* momentum1;
  float* momentum2;
  EmbeddingOptimizer kind;
  float lr, eps, beta1, beta2, weight_decay, bias1, bias2;
};

// Where sorted lookup i's output gradient row starts in dout, and the factor it carries
// (per-sample weight, 1/count for a mean, else 1), as in the CPU's reduce_segment.
__device__ inline void lookup_source(const SegmentArgs& a, int64_t t, int64_t dim,
                                     int64_t total_dim, int32_t i, int64_t* offset, float* scale) {
  const int64_t p = a.pos[i];
  if (a.pooling == EmbeddingPooling::kNone) {
    *offset = a.packed[t] + (p - a.first[t]) * dim;
    *scale = 1.0f;
    return;
  }
  const int64_t bag = a.bag_of[p];
  *offset = (bag - t * a.batch) * total_dim + a.tables.dim_offsets[t];
  *scale = a.psw ? a.psw[p] : a.bag_scale ? a.bag_scale[bag] : 1.0f;
}

// g = the sum over sorted lookups [i0, i1) of scale * dout row, for the columns this lane owns in
// the pass starting at c0: c0 + (q*S + lane)*4 + [0, 4), q < kChunks. Lookups are added in order;
// the group fetches S of them at once (one per lane) and passes them round.
template <int S, int kChunks>
__device__ void reduce_range(const SegmentArgs& a, int64_t t, int64_t dim, int64_t total_dim,
                             int32_t i0, int32_t i1, int64_t c0, int lane, unsigned mask,
                             float (&g)[kChunks][4]) {
#pragma unroll
  for (int q = 0; q < kChunks; ++q)
#pragma unroll
    for (int e = 0; e < 4; ++e) g[q][e] = 0.0f;
  for (int32_t b0 = i0; b0 < i1; b0 += S) {
    int64_t offset = 0;
    float scale = 0.0f;
    if (b0 + lane < i1) lookup_source(a, t, dim, total_dim, b0 + lane, &offset, &scale);
    const int n = min(S, i1 - b0);
    for (int j = 0; j < n; ++j) {
      const float* drow = a.dout + __shfl_sync(mask, offset, j, S);
      const float s = __shfl_sync(mask, scale, j, S);
#pragma unroll
      for (int q = 0; q < kChunks; ++q) {
        const int64_t c = c0 + (q * S + lane) * 4;
        if (c >= dim) continue;
        float v[4];
        detail::load4(drow + c, v);
#pragma unroll
        for (int e = 0; e < 4; ++e) g[q][e] = fmaf(s, v[e], g[q][e]);
      }
    }
  }
}

// Row-wise Adagrad's gradient with L2 decay (g + wd * w), as the CPU forms it.
template <typename W>
__device__ inline void decayed(const SegmentArgs& a, const W* w, const float (&g)[4],
                               float (&out)[4]) {
  float wf[4];
  detail::load4(w, wf);
#pragma unroll
  for (int e = 0; e < 4; ++e)
    out[e] = a.weight_decay != 0.0f ? g[e] + a.weight_decay * wf[e] : g[e];
}

// Row-wise Adagrad: sum of squares of the 4 columns at c (0 past the row).
template <typename W>
__device__ inline float adagrad_squares(const SegmentArgs& a, int64_t elem, int64_t c, int64_t dim,
                                        const float (&g)[4]) {
  if (c >= dim) return 0.0f;
  float d[4];
  decayed(a, static_cast<const W*>(a.weights) + elem + c, g, d);
  return d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + d[3] * d[3];
}

// Writes or applies the reduced gradient g of the 4 columns at c of segment k's row (nothing
// past the row). elem: the row's first element in the weights' layout. See
// EmbeddingOptimizerHyper for the formulas; the weights are read in f32 and rounded once.
template <typename W>
__device__ void emit4(const SegmentArgs& a, int64_t k, int64_t elem, int64_t c, int64_t dim,
                      const float (&g)[4], float multiplier) {
  if (c >= dim) return;
  switch (a.emit) {
    case Emit::kDense:
      detail::store4(a.grad_weights + elem + c, g);
      return;
    case Emit::kSparse:
      detail::store4(a.values + a.value_offsets[k] + c, g);
      return;
    case Emit::kUpdate:
      break;
  }
  W* w = static_cast<W*>(a.weights) + elem + c;
  float wf[4], out[4];
  detail::load4(w, wf);
  switch (a.kind) {
    case EmbeddingOptimizer::kSgd:
#pragma unroll
      for (int e = 0; e < 4; ++e) out[e] = wf[e] - a.lr * (g[e] + a.weight_decay * wf[e]);
      break;
    case EmbeddingOptimizer::kRowwiseAdagrad: {
      float d[4];
      decayed(a, w, g, d);
#pragma unroll
      for (int e = 0; e < 4; ++e) out[e] = wf[e] - multiplier * d[e];
      break;
    }
    case EmbeddingOptimizer::kAdam: {
      float m[4], v[4];
      detail::load4(a.momentum1 + elem + c, m);
      detail::load4(a.momentum2 + elem + c, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        m[e] = a.beta1 * m[e] + (1.0f - a.beta1) * g[e];
        v[e] = a.beta2 * v[e] + (1.0f - a.beta2) * g[e] * g[e];
        const float step =
            (m[e] / a.bias1) / (sqrtf(v[e] / a.bias2) + a.eps) + a.weight_decay * wf[e];
        out[e] = wf[e] - a.lr * step;
      }
      detail::store4(a.momentum1 + elem + c, m);
      detail::store4(a.momentum2 + elem + c, v);
      break;
    }
    case EmbeddingOptimizer::kNone:
      return;
  }
  detail::store4(w, out);
}

// Row-wise Adagrad's state update for a row whose decayed gradient has sum of squares `squares`;
// returns lr / (sqrt(state) + eps). One thread reads and writes the state.
__device__ inline float adagrad_step(const SegmentArgs& a, int64_t t, int64_t row, int64_t dim,
                                     float squares) {
  float* state = a.momentum1 + a.tables.row_offsets[t] + row;
  const float s = *state + squares / float(dim);
  *state = s;
  return a.lr / (sqrtf(s) + a.eps);
}

// A group of S lanes per segment of up to kLongSegment lookups (grid-stride over segments);
// longer segments are listed for segment_block_kernel.
template <int S, int kChunks, typename W>
__global__ void __launch_bounds__(kBlock) segment_group_kernel(SegmentArgs a) {
  constexpr int kPass = S * 4 * kChunks;
  const int lane = int(threadIdx.x) % S;
  const unsigned mask = detail::group_mask<S>();
  const int64_t total_dim = a.tables.dim_offsets[a.tables.num_tables];
  const bool adagrad = a.emit == Emit::kUpdate && a.kind == EmbeddingOptimizer::kRowwiseAdagrad;
  const int32_t segments = *a.num_segments;
  const int64_t groups = int64_t(gridDim.x) * (blockDim.x / S);
  for (int64_t k = blockIdx.x * int64_t(blockDim.x / S) + threadIdx.x / S; k < segments;
       k += groups) {
    const int32_t len = a.seg_len[k], i0 = a.seg_start[k];
    if (len > kLongSegment) {
      if (lane == 0) a.long_list[atomicAdd(a.long_count, 1)] = int32_t(k);
      continue;
    }
    const int64_t t = a.seg_table[k], row = a.seg_row[k], dim = a.tables.dims[t];
    const int64_t elem = a.tables.weight_offsets[t] + row * dim;
    float g[kChunks][4];
    float multiplier = 0.0f;
    if (adagrad) {
      float squares = 0.0f;
      for (int64_t c0 = 0; c0 < dim; c0 += kPass) {
        reduce_range<S, kChunks>(a, t, dim, total_dim, i0, i0 + len, c0, lane, mask, g);
#pragma unroll
        for (int q = 0; q < kChunks; ++q)
          squares += adagrad_squares<W>(a, elem, c0 + (q * S + lane) * 4, dim, g[q]);
      }
      squares = detail::group_sum<S>(mask, squares);
      if (lane == 0) multiplier = adagrad_step(a, t, row, dim, squares);
      multiplier = __shfl_sync(mask, multiplier, 0, S);
    }
    for (int64_t c0 = 0; c0 < dim; c0 += kPass) {
      if (!adagrad || dim > kPass)  // else g still holds the one pass
        reduce_range<S, kChunks>(a, t, dim, total_dim, i0, i0 + len, c0, lane, mask, g);
#pragma unroll
      for (int q = 0; q < kChunks; ++q)
        emit4<W>(a, k, elem, c0 + (q * S + lane) * 4, dim, g[q], multiplier);
    }
  }
}

// A block per long segment (grid-stride over the list). Warp w reduces the w-th contiguous slice
// of the segment; the slices' partial rows meet in shared memory and are added in warp order by
// the threads that own the pass's columns (4 each).
template <typename W>
__global__ void __launch_bounds__(kBlock) segment_block_kernel(SegmentArgs a) {
  constexpr int kChunks = 4;
  constexpr int kPass = 32 * 4 * kChunks;  // columns per pass
  constexpr int kOwners = kPass / 4;       // threads that own 4 columns of the pass
  static_assert(kOwners <= kBlock, "every column of a pass has an owner");
  using Reduce = cub::BlockReduce<float, kBlock>;
  __shared__ float partial[kWarps][kPass];
  __shared__ typename Reduce::TempStorage reduce;
  __shared__ float shared_multiplier;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t total_dim = a.tables.dim_offsets[a.tables.num_tables];
  const bool adagrad = a.emit == Emit::kUpdate && a.kind == EmbeddingOptimizer::kRowwiseAdagrad;
  const int32_t count = *a.long_count;
  for (int32_t li = blockIdx.x; li < count; li += gridDim.x) {
    const int64_t k = a.long_list[li];
    const int32_t len = a.seg_len[k], start = a.seg_start[k];
    const int32_t slice = (len + kWarps - 1) / kWarps;
    const int32_t i0 = start + min(len, warp * slice), i1 = start + min(len, (warp + 1) * slice);
    const int64_t t = a.seg_table[k], row = a.seg_row[k], dim = a.tables.dims[t];
    const int64_t elem = a.tables.weight_offsets[t] + row * dim;
    const int64_t mine = int64_t(threadIdx.x) * 4;  // the owner's first column within a pass
    float g[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // g (owners) = the segment's gradient for columns c0 + mine + [0, 4).
    auto reduce_pass = [&](int64_t c0) {
      float slice_g[kChunks][4];
      reduce_range<32, kChunks>(a, t, dim, total_dim, i0, i1, c0, lane, 0xffffffffu, slice_g);
#pragma unroll
      for (int q = 0; q < kChunks; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) partial[warp][(q * 32 + lane) * 4 + e] = slice_g[q][e];
      __syncthreads();
      if (threadIdx.x < kOwners) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float sum = 0.0f;
          for (int w = 0; w < kWarps; ++w) sum += partial[w][mine + e];
          g[e] = sum;
        }
      }
      __syncthreads();  // partial is rewritten by the next pass
    };
    float multiplier = 0.0f;
    if (adagrad) {
      float squares = 0.0f;
      for (int64_t c0 = 0; c0 < dim; c0 += kPass) {
        reduce_pass(c0);
        if (threadIdx.x < kOwners) squares += adagrad_squares<W>(a, elem, c0 + mine, dim, g);
      }
      squares = Reduce(reduce).Sum(squares);  // valid in thread 0
      if (threadIdx.x == 0) shared_multiplier = adagrad_step(a, t, row, dim, squares);
      __syncthreads();
      multiplier = shared_multiplier;
    }
    for (int64_t c0 = 0; c0 < dim; c0 += kPass) {
      if (!adagrad || dim > kPass) reduce_pass(c0);  // else g still holds the one pass
      if (threadIdx.x < kOwners) emit4<W>(a, k, elem, c0 + mine, dim, g, multiplier);
    }
    __syncthreads();  // reduce's and shared_multiplier's storage is reused by the next segment
  }
}

// ---------------------------------------------------------------- dense zeros, psw gradient

// Zeroes every table's [rows, dims] block of the dense gradient (not the gaps between tables).
__global__ void zero_tables_kernel(EmbeddingTables tables, float* grad) {
  for (int64_t t = blockIdx.y; t < tables.num_tables; t += gridDim.y) {
    float* block = grad + tables.weight_offsets[t];
    const int64_t size = tables.rows[t] * tables.dims[t];  // a multiple of 4
    if (detail::aligned_to(block, 16)) {
      LOOM_GRID_STRIDE(i, size / 4)
      reinterpret_cast<float4*>(block)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
      LOOM_GRID_STRIDE(i, size)
      block[i] = 0.0f;
    }
  }
}

// A warp per bag: grad_psw[p] = dot(dout[b, table's columns], weight row of p), 0 when skipped.
template <typename W, typename Index>
__global__ void __launch_bounds__(kBlock)
    psw_grad_kernel(EmbeddingTables tables, const W* weights, const Index* indices,
                    const Index* offsets, int64_t batch, const float* dout,
                    EmbeddingBoundsCheck mode, float* grad_psw) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t nt = tables.num_tables, bags = nt * batch;
  const int64_t total_dim = tables.dim_offsets[nt];
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t tb = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; tb < bags;
       tb += warps) {
    const int64_t t = tb / batch, b = tb - t * batch, dim = tables.dims[t];
    const float* drow = dout + b * total_dim + tables.dim_offsets[t];
    const W* table = weights + tables.weight_offsets[t];
    for (int64_t p = int64_t(offsets[tb]); p < int64_t(offsets[tb + 1]); ++p) {
      const int64_t r = detail::resolve_row(int64_t(indices[p]), tables.rows[t], mode);
      float sum = 0.0f;
      if (r >= 0) {
        for (int64_t c = lane * 4; c < dim; c += 32 * 4) {
          float d[4], w[4];
          detail::load4(drow + c, d);
          detail::load4(table + r * dim + c, w);
#pragma unroll
          for (int e = 0; e < 4; ++e) sum = fmaf(d[e], w[e], sum);
        }
      }
      sum = detail::group_sum<32>(0xffffffffu, sum);
      if (lane == 0) grad_psw[p] = sum;
    }
  }
}

unsigned clamp_grid(int64_t blocks) {
  return unsigned(blocks < 1 ? 1 : blocks < int64_t(kMaxGridBlocks) ? blocks : kMaxGridBlocks);
}

template <typename Index>
void psw_grad(const EmbeddingTables& tables, const void* weights,
              const EmbeddingBagIndices<Index>& in, const float* dout,
              const EmbeddingBagOptions& opt, float* grad_psw, Stream stream) {
  if (!grad_psw || in.num_indices == 0) return;
  if (opt.pooling != EmbeddingPooling::kSum) {  // validation rejects weights here; stay defined
    LOOM_CUDA_CHECK(cudaMemsetAsync(grad_psw, 0, size_t(in.num_indices) * sizeof(float), stream));
    return;
  }
  const int64_t bags = tables.num_tables * in.batch_size;
  detail::dispatch_dtype(tables.dtype, [&](auto w) {
    using W = decltype(w);
    auto kernel = psw_grad_kernel<W, Index>;
    LOOM_LAUNCH(kernel, clamp_grid((bags + kWarps - 1) / kWarps), kBlock, 0, stream, tables,
                static_cast<const W*>(weights), in.indices, in.offsets, in.batch_size, dout,
                opt.bounds_check, grad_psw);
  });
}

// ---------------------------------------------------------------- the common driver

struct Outputs {
  Emit emit;
  float* grad_weights = nullptr;
  EmbeddingSparseGrad sparse;
  int64_t* num_unique = nullptr;
  void* weights = nullptr;
  EmbeddingOptimizerHyper hyper;
  EmbeddingOptimizerState state;
};

template <int S, int kChunks, typename W>
void launch_segments(const SegmentArgs& a, int64_t n, Stream stream) {
  auto group = segment_group_kernel<S, kChunks, W>;
  LOOM_LAUNCH(group, clamp_grid((n + kBlock / S - 1) / (kBlock / S)), kBlock, 0, stream, a);
  if (n <= kLongSegment) return;  // no segment can be long
  auto block = segment_block_kernel<W>;
  LOOM_LAUNCH(block, clamp_grid(n / (kLongSegment + 1)), kBlock, 0, stream, a);
}

template <typename Index>
void run_backward(const EmbeddingTables& tables, const EmbeddingTablesInfo& info,
                  const EmbeddingBagIndices<Index>& in, const float* dout,
                  const EmbeddingBagOptions& opt, const Outputs& o, void* workspace,
                  size_t workspace_bytes, Stream stream) {
  const int64_t nt = tables.num_tables, nb = in.batch_size, bags = nt * nb, n = in.num_indices;
  LOOM_CHECK(
      n <= std::numeric_limits<int32_t>::max() && bags <= std::numeric_limits<int32_t>::max(),
      "cuda embedding_bag backward: ", n, " lookups in ", bags,
      " bags; at most 2^31-1 of each per call (split the batch)");
  if (o.emit == Emit::kDense && nt > 0) {
    const unsigned per_table = unsigned(nt < 65535 ? nt : 65535);
    const unsigned blocks = clamp_grid(4096 / per_table);
    LOOM_LAUNCH(zero_tables_kernel, dim3(blocks, per_table), kBlock, 0, stream, tables,
                o.grad_weights);
  }
  if (n == 0 || bags == 0) {  // (validated input has no lookups without bags)
    if (o.emit == Emit::kSparse) {
      LOOM_CUDA_CHECK(cudaMemsetAsync(o.sparse.value_offsets, 0, sizeof(int64_t), stream));
      if (o.num_unique) LOOM_CUDA_CHECK(cudaMemsetAsync(o.num_unique, 0, sizeof(int64_t), stream));
    }
    return;
  }
  const int end_bit = sort_end_bit(info);
  const Layout l = make_layout(nt, bags, n, end_bit);
  LOOM_CHECK(workspace != nullptr && workspace_bytes >= l.total &&
                 reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
             "cuda embedding_bag backward: workspace of ", workspace_bytes, " bytes at ", workspace,
             ", needs ", l.total,
             " bytes, 256-byte aligned (embedding_bag_backward_workspace_bytes)");
  void* ws = workspace;
  const bool none = opt.pooling == EmbeddingPooling::kNone;
  const bool mean = opt.pooling == EmbeddingPooling::kMean;
  int64_t* row_base = at<int64_t>(ws, l.row_base);
  int32_t* counters = at<int32_t>(ws, l.counters);
  void* temp = at<void>(ws, l.temp);
  size_t temp_bytes = l.temp_bytes;

  // 1. Keys. See Note [Deterministic CUDA embedding backward].
  detail::launch_table_prefix(tables, in.offsets, nb, row_base,
                              none ? at<int64_t>(ws, l.packed) : nullptr,
                              none ? at<int64_t>(ws, l.first) : nullptr, stream);
  auto keys = keys_kernel<Index>;
  LOOM_LAUNCH(keys, clamp_grid((bags + kWarps - 1) / kWarps), kBlock, 0, stream, tables.rows,
              in.indices, in.offsets, nt, nb, opt.bounds_check, row_base,
              at<uint64_t>(ws, l.keys[0]), at<int32_t>(ws, l.pos[0]), at<int32_t>(ws, l.bag_of),
              mean ? at<float>(ws, l.bag_scale) : nullptr);

  // 2. Stable sort by key.
  cub::DoubleBuffer<uint64_t> sorted_keys(at<uint64_t>(ws, l.keys[0]), at<uint64_t>(ws, l.keys[1]));
  cub::DoubleBuffer<int32_t> sorted_pos(at<int32_t>(ws, l.pos[0]), at<int32_t>(ws, l.pos[1]));
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, sorted_keys, sorted_pos, int(n),
                                                  0, end_bit, stream));

  // 3. Segments: runs of one key, their lengths (zero past the last run, so the scan of lengths
  // stays defined there) and starts.
  int32_t* seg_len = at<int32_t>(ws, l.seg_len);
  int32_t* seg_start = at<int32_t>(ws, l.seg_start);
  uint64_t* unique_keys = at<uint64_t>(ws, l.unique_keys);
  LOOM_CUDA_CHECK(cudaMemsetAsync(seg_len, 0, size_t(n) * sizeof(int32_t), stream));
  LOOM_CUDA_CHECK(cudaMemsetAsync(counters, 0, 3 * sizeof(int32_t), stream));
  temp_bytes = l.temp_bytes;
  LOOM_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(
      temp, temp_bytes, sorted_keys.Current(), unique_keys, seg_len, counters, int(n), stream));
  temp_bytes = l.temp_bytes;
  LOOM_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(temp, temp_bytes, seg_len, seg_start, int(n), stream));
  const bool sparse = o.emit == Emit::kSparse;
  // The sorted keys are dead after the encode; their other buffer holds the sparse row widths.
  int64_t* seg_dim = sparse ? reinterpret_cast<int64_t*>(sorted_keys.Alternate()) : nullptr;
  LOOM_LAUNCH(segment_info_kernel, grid_stride_blocks(n), kBlock, 0, stream, unique_keys, counters,
              row_base, tables.dims, nt, n, counters + 1, at<int32_t>(ws, l.seg_table),
              at<int64_t>(ws, l.seg_row), sparse ? o.num_unique : nullptr,
              sparse ? o.sparse.tables : nullptr, sparse ? o.sparse.rows : nullptr, seg_dim);
  if (sparse) {
    LOOM_CUDA_CHECK(cudaMemsetAsync(o.sparse.value_offsets, 0, sizeof(int64_t), stream));
    temp_bytes = l.temp_bytes;
    LOOM_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, temp_bytes, seg_dim,
                                                  o.sparse.value_offsets + 1, int(n), stream));
  }

  // 4, 5. Reduce each segment and emit it.
  SegmentArgs a{};
  a.tables = tables;
  a.batch = nb;
  a.pooling = opt.pooling;
  a.dout = dout;
  a.psw = opt.pooling == EmbeddingPooling::kSum ? in.per_sample_weights : nullptr;
  a.bag_scale = mean ? at<float>(ws, l.bag_scale) : nullptr;
  a.packed = none ? at<int64_t>(ws, l.packed) : nullptr;
  a.first = none ? at<int64_t>(ws, l.first) : nullptr;
  a.pos = sorted_pos.Current();
  a.bag_of = at<int32_t>(ws, l.bag_of);
  a.seg_start = seg_start;
  a.seg_len = seg_len;
  a.seg_table = at<int32_t>(ws, l.seg_table);
  a.seg_row = at<int64_t>(ws, l.seg_row);
  a.num_segments = counters + 1;
  a.long_list = at<int32_t>(ws, l.long_list);
  a.long_count = counters + 2;
  a.emit = o.emit;
  a.grad_weights = o.grad_weights;
  a.values = o.sparse.values;
  a.value_offsets = o.sparse.value_offsets;
  a.weights = o.weights;
  a.momentum1 = o.state.momentum1;
  a.momentum2 = o.state.momentum2;
  a.kind = o.hyper.kind;
  a.lr = o.hyper.lr;
  a.eps = o.hyper.eps;
  a.beta1 = o.hyper.beta1;
  a.beta2 = o.hyper.beta2;
  a.weight_decay = o.hyper.weight_decay;
  // As the CPU computes them: in double, rounded once.
  a.bias1 = float(1.0 - std::pow(double(o.hyper.beta1), double(o.hyper.step)));
  a.bias2 = float(1.0 - std::pow(double(o.hyper.beta2), double(o.hyper.step)));
  // Only an update reads or writes weights; the gradient forms run the f32 instantiation.
  const EmbeddingDType dtype = o.emit == Emit::kUpdate ? tables.dtype : EmbeddingDType::kF32;
  detail::dispatch_dtype(dtype, [&](auto w) {
    using W = decltype(w);
    detail::dispatch_group(info.max_dim, 4, [&](auto lanes, auto chunks) {
      launch_segments<decltype(lanes)::value, decltype(chunks)::value, W>(a, n, stream);
    });
  });
}

}  // namespace

template <typename Index>
size_t embedding_bag_backward_workspace_bytes(const EmbeddingTables& tables,
                                              const EmbeddingTablesInfo& info,
                                              const EmbeddingBagIndices<Index>& in) {
  if (in.num_indices <= 0) return 0;
  return make_layout(tables.num_tables, tables.num_tables * in.batch_size, in.num_indices,
                     sort_end_bit(info))
      .total;
}

template <typename Index>
void embedding_bag_backward_dense(const EmbeddingTables& tables, const EmbeddingTablesInfo& info,
                                  const void* weights, const EmbeddingBagIndices<Index>& in,
                                  const float* dout, float* grad_weights,
                                  float* grad_per_sample_weights, const EmbeddingBagOptions& opt,
                                  void* workspace, size_t workspace_bytes, Stream stream) {
  psw_grad(tables, weights, in, dout, opt, grad_per_sample_weights, stream);
  Outputs o;
  o.emit = Emit::kDense;
  o.grad_weights = grad_weights;
  run_backward(tables, info, in, dout, opt, o, workspace, workspace_bytes, stream);
}

template <typename Index>
void embedding_bag_backward_sparse(const EmbeddingTables& tables, const EmbeddingTablesInfo& info,
                                   const void* weights, const EmbeddingBagIndices<Index>& in,
                                   const float* dout, const EmbeddingSparseGrad& grad,
                                   int64_t* num_unique, float* grad_per_sample_weights,
                                   const EmbeddingBagOptions& opt, void* workspace,
                                   size_t workspace_bytes, Stream stream) {
  psw_grad(tables, weights, in, dout, opt, grad_per_sample_weights, stream);
  Outputs o;
  o.emit = Emit::kSparse;
  o.sparse = grad;
  o.num_unique = num_unique;
  run_backward(tables, info, in, dout, opt, o, workspace, workspace_bytes, stream);
}

template <typename Index>
void embedding_bag_backward_fused(const EmbeddingTables& tables, const EmbeddingTablesInfo& info,
                                  void* weights, const EmbeddingBagIndices<Index>& in,
                                  const float* dout, const EmbeddingOptimizerHyper& hyper,
                                  const EmbeddingOptimizerState& state,
                                  float* grad_per_sample_weights, const EmbeddingBagOptions& opt,
                                  void* workspace, size_t workspace_bytes, Stream stream) {
  psw_grad(tables, weights, in, dout, opt, grad_per_sample_weights, stream);  // before the update
  if (hyper.kind == EmbeddingOptimizer::kNone) return;
  Outputs o;
  o.emit = Emit::kUpdate;
  o.weights = weights;
  o.hyper = hyper;
  o.state = state;
  run_backward(tables, info, in, dout, opt, o, workspace, workspace_bytes, stream);
}

#define LOOM_EMBEDDING_BAG_BACKWARD(Index)                                                         \
  template size_t embedding_bag_backward_workspace_bytes<Index>(                                   \
      const EmbeddingTables&, const EmbeddingTablesInfo&, const EmbeddingBagIndices<Index>&);      \
  template void embedding_bag_backward_dense<Index>(                                               \
      const EmbeddingTables&, const EmbeddingTablesInfo&, const void*,                             \
      const EmbeddingBagIndices<Index>&, const float*, float*, float*, const EmbeddingBagOptions&, \
      void*, size_t, Stream);                                                                      \
  template void embedding_bag_backward_sparse<Index>(                                              \
      const EmbeddingTables&, const EmbeddingTablesInfo&, const void*,                             \
      const EmbeddingBagIndices<Index>&, const float*, const EmbeddingSparseGrad&, int64_t*,       \
      float*, const EmbeddingBagOptions&, void*, size_t, Stream);                                  \
  template void embedding_bag_backward_fused<Index>(                                               \
      const EmbeddingTables&, const EmbeddingTablesInfo&, void*,                                   \
      const EmbeddingBagIndices<Index>&, const float*, const EmbeddingOptimizerHyper&,             \
      const EmbeddingOptimizerState&, float*, const EmbeddingBagOptions&, void*, size_t, Stream);
LOOM_EMBEDDING_BAG_BACKWARD(int32_t)
LOOM_EMBEDDING_BAG_BACKWARD(int64_t)
#undef LOOM_EMBEDDING_BAG_BACKWARD

}  // namespace loom::kernels::cuda
