// Table-batched embedding-bag forward and input validation on CUDA (the CPU twin is
// kernels/cpu/embedding_bag.cpp). The forward gives each bag a group of S lanes (S = 4..32, the
// fewest that cover the widest row with one 16-byte vector per lane); the group reads S indices
// at once, one per lane, and passes them round by shuffles, so each row read is a coalesced
// 16-byte-per-lane load and the bag's sums stay in registers until they are written once.
//
// The one non-obvious decision: validation finds the CPU's "first bad entry" with one atomicMin
// on a 64-bit key, (stage << 56) | position, where the stage orders the checks exactly as
// cpu::validate_embedding_bag makes them (table configs, lengths, first offset, decreasing
// offsets, last offset, indices). Every check runs in parallel; the smallest key is the entry the
// CPU would have stopped at, and a last one-thread kernel turns it into the full error.
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/embedding_bag.h"
#include "kernels/cuda/embedding_bag_impl.cuh"

namespace loom::kernels::cuda {

namespace {

using detail::kBlock;

// ---------------------------------------------------------------- per-table prefix sums

constexpr int kPrefixBlock = 256;

template <typename Index>
__global__ void __launch_bounds__(kPrefixBlock)
    table_prefix_kernel(EmbeddingTables tables, const Index* offsets, int64_t batch,
                        int64_t* row_base, int64_t* packed, int64_t* first) {
  using Scan = cub::BlockScan<int64_t, kPrefixBlock>;
  __shared__ typename Scan::TempStorage scan;
  const int64_t nt = tables.num_tables;
  if (threadIdx.x == 0) {
    if (row_base) row_base[0] = 0;
    if (packed) packed[0] = 0;
  }
  int64_t rows_before = 0, packed_before = 0;  // the same in every thread (block aggregates)
  for (int64_t t0 = 0; t0 < nt; t0 += kPrefixBlock) {
    const int64_t t = t0 + threadIdx.x;
    int64_t rows = 0, size = 0;
    if (t < nt) {
      const int64_t begin = int64_t(offsets[t * batch]);
      rows = tables.rows[t];
      size = (int64_t(offsets[(t + 1) * batch]) - begin) * tables.dims[t];
      if (first) first[t] = begin;
    }
    int64_t aggregate = 0;
    Scan(scan).InclusiveSum(rows, rows, aggregate);
    if (t < nt && row_base) row_base[t + 1] = rows_before + rows;
    rows_before += aggregate;
    __syncthreads();  // scan's storage is reused
    Scan(scan).InclusiveSum(size, size, aggregate);
    if (t < nt && packed) packed[t + 1] = packed_before + size;
    packed_before += aggregate;
    __syncthreads();
  }
}

// ---------------------------------------------------------------- validation

using Kind = EmbeddingBagErrorKind;
using Key = unsigned long long;

// The stages, in the CPU's order of checking. See the note at the top of the file.
enum Stage : int {
  kStageTable,
  kStageHost,
  kStageFirstOffset,
  kStageDecreasing,
  kStageLast,
  kStageIndex
};
constexpr Key kNoError = ~Key(0);
constexpr int kStageShift = 56;

__host__ __device__ inline Key make_key(int stage, int64_t position) {
  return (Key(stage) << kStageShift) | Key(position);
}

// The table whose lookups include position p: the last t with offsets[t*B] <= p (tables with no
// lookups share their start with the next), or -1. Bounded for any offsets, valid or not.
template <typename Index>
__device__ int64_t table_of(const Index* offsets, int64_t nt, int64_t nb, int64_t p) {
  int64_t lo = 0, hi = nt;  // upper bound of p among offsets[0], offsets[B], ..., offsets[(T-1)B]
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (int64_t(offsets[mid * nb]) <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - 1;
}

__global__ void validate_init_kernel(Key* key, Key value) { *key = value; }

__global__ void validate_tables_kernel(EmbeddingTables tables, Key* key) {
  LOOM_GRID_STRIDE(t, tables.num_tables) {
    const int64_t dim = tables.dims[t];
    if (dim <= 0 || dim % 4 != 0)
      atomicMin(key, make_key(kStageTable, 2 * t));
    else if (tables.rows[t] < 0)
      atomicMin(key, make_key(kStageTable, 2 * t + 1));
  }
}

template <typename Index>
__global__ void validate_offsets_kernel(const Index* offsets, int64_t bags, int64_t num_indices,
                                        Key* key) {
  LOOM_GRID_STRIDE(p, bags + 1) {
    if (p == 0 && offsets[0] != 0) atomicMin(key, make_key(kStageFirstOffset, 0));
    if (p > 0 && offsets[p] < offsets[p - 1]) atomicMin(key, make_key(kStageDecreasing, p));
    if (p == bags && int64_t(offsets[bags]) != num_indices) atomicMin(key, make_key(kStageLast, 0));
  }
}

// The lowest bad position; a warp agrees on its minimum first, so a batch of bad indices costs
// one atomic per warp, not one per index.
template <typename Index>
__global__ void validate_indices_kernel(const Index* indices, const Index* offsets,
                                        const int64_t* rows, int64_t nt, int64_t nb,
                                        int64_t num_indices, Key* key) {
  Key best = kNoError;
  LOOM_GRID_STRIDE(p, num_indices) {
    const int64_t t = table_of(offsets, nt, nb, p);
    if (t >= 0 && detail::is_bad_index(int64_t(indices[p]), rows[t]))
      best = min(best, make_key(kStageIndex, p));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) best = min(best, __shfl_xor_sync(0xffffffffu, best, o));
  if ((threadIdx.x & 31) == 0 && best != kNoError) atomicMin(key, best);
}

__device__ EmbeddingBagError make_error(Kind kind, int64_t table, int64_t bag, int64_t position,
                                        int64_t value, int64_t expected) {
  EmbeddingBagError e;
  e.kind = kind;
  e.table = table;
  e.bag = bag;
  e.position = position;
  e.value = value;
  e.expected = expected;
  return e;
}

// The error the smallest key stands for, with the fields the CPU reports for it.
template <typename Index>
__global__ void validate_finish_kernel(const Key* key, EmbeddingBagError host_error,
                                       EmbeddingTables tables, const Index* indices,
                                       const Index* offsets, int64_t nb, int64_t num_indices,
                                       EmbeddingBagError* error) {
  const Key k = *key;
  const int64_t nt = tables.num_tables, bags = nt * nb;
  const int64_t p = int64_t(k & ((Key(1) << kStageShift) - 1));
  EmbeddingBagError e;
  if (k != kNoError) {
    switch (int(k >> kStageShift)) {
      case kStageTable:
        e = p % 2 == 0 ? make_error(Kind::kBadTable, p / 2, -1, -1, tables.dims[p / 2], 4)
                       : make_error(Kind::kBadTable, p / 2, -1, -1, tables.rows[p / 2], 0);
        break;
      case kStageHost:
        e = host_error;
        break;
      case kStageFirstOffset:
        e = make_error(Kind::kFirstOffsetNotZero, 0, 0, 0, int64_t(offsets[0]), 0);
        break;
      case kStageDecreasing:
        e = make_error(Kind::kDecreasingOffsets, (p - 1) / nb, (p - 1) % nb, p, int64_t(offsets[p]),
                       int64_t(offsets[p - 1]));
        break;
      case kStageLast:
        e = make_error(Kind::kLastOffsetMismatch, nt - 1, nb - 1, bags, int64_t(offsets[bags]),
                       num_indices);
        break;
      default: {  // kStageIndex; the bag is the last b with offsets[t*B+b] <= p, as on the CPU
        const int64_t t = table_of(offsets, nt, nb, p);
        int64_t lo = 0, hi = nb;
        while (lo < hi) {
          const int64_t mid = (lo + hi) / 2;
          if (int64_t(offsets[t * nb + mid]) <= p)
            lo = mid + 1;
          else
            hi = mid;
        }
        const int64_t value = int64_t(indices[p]);
        e = make_error(value < 0 ? Kind::kNegativeIndex : Kind::kIndexOutOfRange, t, lo - 1, p,
                       value, tables.rows[t]);
      }
    }
  }
  *error = e;
}

// The checks on host-known numbers (lengths, weights with pooling), in the CPU's order.
template <typename Index>
EmbeddingBagError host_checks(const EmbeddingTables& tables, const EmbeddingBagIndices<Index>& in,
                              const EmbeddingBagOptions& opt) {
  const int64_t nt = tables.num_tables, nb = in.batch_size;
  EmbeddingBagError e;
  e.kind = Kind::kWrongLength;
  if (nb < 0 || in.num_offsets != nt * nb + 1) {
    e.value = in.num_offsets;
    e.expected = nt * nb + 1;
  } else if (in.num_indices < 0) {
    e.value = in.num_indices;
  } else if (in.per_sample_weights && in.num_per_sample_weights != in.num_indices) {
    e.value = in.num_per_sample_weights;
    e.expected = in.num_indices;
  } else if (in.per_sample_weights && opt.pooling != EmbeddingPooling::kSum) {
    e.kind = Kind::kWeightsNeedSum;
  } else {
    e.kind = Kind::kNone;
  }
  return e;
}

// ---------------------------------------------------------------- forward

template <typename W, typename Index>
struct ForwardArgs {
  EmbeddingTables tables;
  const W* weights;
  const Index* indices;
  const Index* offsets;
  const float* psw;  // kSum only, else null
  int64_t batch, bags;
  const int64_t* packed;  // kNone only: see Note [Embedding bag layout]
  float* out;
  Key* num_bad;  // may be null
  EmbeddingPooling pooling;
  EmbeddingBoundsCheck mode;
};

// One group of S lanes per bag (grid-stride over bags). Lane l owns columns
// c0 + (q*S + l)*kVec + [0, kVec) for q < kChunks: 16 contiguous bytes of the row per lane, a
// warp's loads together contiguous. Rows wider than a pass (S*kVec*kChunks columns) take more
// passes over the bag.
template <typename W, typename Index, int S, int kChunks>
__global__ void __launch_bounds__(kBlock) forward_kernel(ForwardArgs<W, Index> a) {
  constexpr int kVec = 16 / int(sizeof(W));
  constexpr int kPass = S * kVec * kChunks;
  const int lane = int(threadIdx.x) % S;
  const unsigned mask = detail::group_mask<S>();
  const bool none = a.pooling == EmbeddingPooling::kNone;
  const bool mean = a.pooling == EmbeddingPooling::kMean;
  const int64_t total_dim = a.tables.dim_offsets[a.tables.num_tables];
  const int64_t groups = int64_t(gridDim.x) * (blockDim.x / S);
  for (int64_t tb = blockIdx.x * int64_t(blockDim.x / S) + threadIdx.x / S; tb < a.bags;
       tb += groups) {
    const int64_t t = tb / a.batch, b = tb - t * a.batch;
    const int64_t dim = a.tables.dims[t], rows = a.tables.rows[t];
    const W* table = a.weights + a.tables.weight_offsets[t];
    const int64_t begin = int64_t(a.offsets[tb]), end = int64_t(a.offsets[tb + 1]);
    // Pooled: the bag's output row. Unpooled: lookup `begin`'s row; lookup p's is (p-begin)*dim on.
    float* dst = none ? a.out + a.packed[t] + (begin - int64_t(a.offsets[t * a.batch])) * dim
                      : a.out + b * total_dim + a.tables.dim_offsets[t];
    int bad = 0;
    for (int64_t c0 = 0; c0 < dim; c0 += kPass) {
      float acc[kChunks][kVec];
#pragma unroll
      for (int q = 0; q < kChunks; ++q)
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[q][e] = 0.0f;
      int counted = 0;
      for (int64_t p0 = begin; p0 < end; p0 += S) {
        // Lane l resolves lookup p0 + l; the group then walks the S lookups in index order.
        int64_t r = -1;
        float w = 1.0f;
        if (p0 + lane < end) {
          const int64_t index = int64_t(a.indices[p0 + lane]);
          r = detail::resolve_row(index, rows, a.mode);
          if (a.psw) w = a.psw[p0 + lane];
          if (c0 == 0) bad += detail::is_bad_index(index, rows);
          counted += r >= 0;
        }
        const int n = int(end - p0 < S ? end - p0 : S);
        for (int j = 0; j < n; ++j) {
          const int64_t rj = __shfl_sync(mask, r, j, S);
          const float wj = __shfl_sync(mask, w, j, S);
          const W* row = table + (rj < 0 ? 0 : rj) * dim;
          if (none) {  // lookup p0+j's row, converted, or zeros when it is skipped
            float* o = dst + (p0 + j - begin) * dim;
#pragma unroll
            for (int q = 0; q < kChunks; ++q) {
              const int64_t c = c0 + (q * S + lane) * kVec;
              if (c >= dim) continue;
              float v[kVec] = {};
              if (rj >= 0) detail::load_vec<W, kVec>(row + c, dim - c, v);
              detail::store_vec<kVec>(o + c, dim - c, v);
            }
            continue;
          }
          if (rj < 0) continue;
#pragma unroll
          for (int q = 0; q < kChunks; ++q) {
            const int64_t c = c0 + (q * S + lane) * kVec;
            if (c >= dim) continue;
            float v[kVec];
            detail::load_vec<W, kVec>(row + c, dim - c, v);
#pragma unroll
            for (int e = 0; e < kVec; ++e) acc[q][e] = fmaf(wj, v[e], acc[q][e]);
          }
        }
      }
      if (none) continue;
      counted = detail::group_sum<S>(mask, counted);
      // As the CPU: the mean multiplies by 1/count (an empty mean is the zero sum).
      const float scale = mean && counted > 0 ? 1.0f / float(counted) : 1.0f;
#pragma unroll
      for (int q = 0; q < kChunks; ++q) {
        const int64_t c = c0 + (q * S + lane) * kVec;
        if (c >= dim) continue;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[q][e] *= scale;
        detail::store_vec<kVec>(dst + c, dim - c, acc[q]);
      }
    }
    if (a.num_bad) {
      bad = detail::group_sum<S>(mask, bad);
      if (lane == 0 && bad > 0) atomicAdd(a.num_bad, Key(bad));
    }
  }
}

template <typename W, typename Index, int S, int kChunks>
void launch_forward(const ForwardArgs<W, Index>& a, Stream stream) {
  const int64_t groups_per_block = kBlock / S;
  const int64_t blocks = (a.bags + groups_per_block - 1) / groups_per_block;
  const unsigned grid = unsigned(blocks < int64_t(kMaxGridBlocks) ? blocks : kMaxGridBlocks);
  auto kernel = forward_kernel<W, Index, S, kChunks>;
  LOOM_LAUNCH(kernel, grid, kBlock, 0, stream, a);
}

}  // namespace

// ---------------------------------------------------------------- entry points

EmbeddingTablesInfo embedding_tables_info(int64_t num_tables, const int64_t* rows,
                                          const int64_t* dims) {
  EmbeddingTablesInfo info;
  info.total_rows = 0;
  for (int64_t t = 0; t < num_tables; ++t) {
    info.max_dim = dims[t] > info.max_dim ? dims[t] : info.max_dim;
    info.total_rows += rows[t] > 0 ? rows[t] : 0;
  }
  return info;
}

namespace detail {

template <typename Index>
void launch_table_prefix(const EmbeddingTables& tables, const Index* offsets, int64_t batch,
                         int64_t* row_base, int64_t* packed, int64_t* first, Stream stream) {
  auto kernel = table_prefix_kernel<Index>;
  LOOM_LAUNCH(kernel, 1, kPrefixBlock, 0, stream, tables, offsets, batch, row_base, packed, first);
}

template void launch_table_prefix<int32_t>(const EmbeddingTables&, const int32_t*, int64_t,
                                           int64_t*, int64_t*, int64_t*, Stream);
template void launch_table_prefix<int64_t>(const EmbeddingTables&, const int64_t*, int64_t,
                                           int64_t*, int64_t*, int64_t*, Stream);

}  // namespace detail

template <typename Index>
void validate_embedding_bag(const EmbeddingTables& tables, const EmbeddingBagIndices<Index>& in,
                            const EmbeddingBagOptions& opt, EmbeddingBagError* error,
                            Stream stream) {
  const int64_t nt = tables.num_tables, nb = in.batch_size;
  const EmbeddingBagError host_error = host_checks(tables, in, opt);
  const bool host_ok = host_error.kind == Kind::kNone;
  Key* key = nullptr;
  LOOM_CUDA_CHECK(cudaMallocAsync(&key, sizeof(Key), stream));
  LOOM_LAUNCH(validate_init_kernel, 1, 1, 0, stream, key,
              host_ok ? kNoError : make_key(kStageHost, 0));
  if (nt > 0)
    LOOM_LAUNCH(validate_tables_kernel, grid_stride_blocks(nt), kBlock, 0, stream, tables, key);
  // Offsets are read only when their length is right; indices only when they are to be checked.
  if (host_ok) {
    auto offsets_kernel = validate_offsets_kernel<Index>;
    LOOM_LAUNCH(offsets_kernel, grid_stride_blocks(nt * nb + 1), kBlock, 0, stream, in.offsets,
                nt * nb, in.num_indices, key);
    if (opt.bounds_check == EmbeddingBoundsCheck::kError && in.num_indices > 0 && nt > 0) {
      auto indices_kernel = validate_indices_kernel<Index>;
      LOOM_LAUNCH(indices_kernel, grid_stride_blocks(in.num_indices), kBlock, 0, stream, in.indices,
                  in.offsets, tables.rows, nt, nb, in.num_indices, key);
    }
  }
  auto finish_kernel = validate_finish_kernel<Index>;
  LOOM_LAUNCH(finish_kernel, 1, 1, 0, stream, key, host_error, tables, in.indices, in.offsets, nb,
              in.num_indices, error);
  LOOM_CUDA_CHECK(cudaFreeAsync(key, stream));
}

template <typename Index>
int64_t embedding_bag_packed_size(const EmbeddingTables& tables,
                                  const EmbeddingBagIndices<Index>& in, Stream stream) {
  const int64_t nt = tables.num_tables;
  if (nt == 0) return 0;
  int64_t* packed = nullptr;
  LOOM_CUDA_CHECK(cudaMallocAsync(&packed, size_t(nt + 1) * sizeof(int64_t), stream));
  detail::launch_table_prefix(tables, in.offsets, in.batch_size, nullptr, packed, nullptr, stream);
  int64_t size = 0;
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(&size, packed + nt, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_CHECK(cudaFreeAsync(packed, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return size;
}

template <typename Index>
void embedding_bag_forward(const EmbeddingTables& tables, const EmbeddingTablesInfo& info,
                           const void* weights, const EmbeddingBagIndices<Index>& in, float* out,
                           int64_t* num_bad, const EmbeddingBagOptions& opt, Stream stream) {
  const int64_t nt = tables.num_tables, bags = nt * in.batch_size;
  if (num_bad) LOOM_CUDA_CHECK(cudaMemsetAsync(num_bad, 0, sizeof(int64_t), stream));
  if (bags <= 0) return;
  const bool none = opt.pooling == EmbeddingPooling::kNone;
  int64_t* packed = nullptr;
  if (none) {
    LOOM_CUDA_CHECK(cudaMallocAsync(&packed, size_t(nt + 1) * sizeof(int64_t), stream));
    detail::launch_table_prefix(tables, in.offsets, in.batch_size, nullptr, packed, nullptr,
                                stream);
  }
  detail::dispatch_dtype(tables.dtype, [&](auto w) {
    using W = decltype(w);
    ForwardArgs<W, Index> a;
    a.tables = tables;
    a.weights = static_cast<const W*>(weights);
    a.indices = in.indices;
    a.offsets = in.offsets;
    a.psw = opt.pooling == EmbeddingPooling::kSum ? in.per_sample_weights : nullptr;
    a.batch = in.batch_size;
    a.bags = bags;
    a.packed = packed;
    a.out = out;
    a.num_bad = reinterpret_cast<Key*>(num_bad);
    a.pooling = opt.pooling;
    a.mode = opt.bounds_check;
    detail::dispatch_group(info.max_dim, 16 / int(sizeof(W)), [&](auto lanes, auto chunks) {
      launch_forward<W, Index, decltype(lanes)::value, decltype(chunks)::value>(a, stream);
    });
  });
  if (packed) LOOM_CUDA_CHECK(cudaFreeAsync(packed, stream));
}

#define LOOM_EMBEDDING_BAG_FORWARD(Index)                                                       \
  template void validate_embedding_bag<Index>(                                                  \
      const EmbeddingTables&, const EmbeddingBagIndices<Index>&, const EmbeddingBagOptions&,    \
      EmbeddingBagError*, Stream);                                                              \
  template int64_t embedding_bag_packed_size<Index>(const EmbeddingTables&,                     \
                                                    const EmbeddingBagIndices<Index>&, Stream); \
  template void embedding_bag_forward<Index>(                                                   \
      const EmbeddingTables&, const EmbeddingTablesInfo&, const void*,                          \
      const EmbeddingBagIndices<Index>&, float*, int64_t*, const EmbeddingBagOptions&, Stream);
LOOM_EMBEDDING_BAG_FORWARD(int32_t)
LOOM_EMBEDDING_BAG_FORWARD(int64_t)
#undef LOOM_EMBEDDING_BAG_FORWARD

}  // namespace loom::kernels::cuda
