// Table-batched embedding-bag forward and input validation on the CPU. One OpenMP loop over all
// T*B bags of all tables: a bag's columns are summed in a tile of up to 128 floats held in vector
// registers and written once, and the rows of the next lookups are prefetched, since the lookup
// is a chain of random row reads that the hardware prefetcher cannot guess.
#include "kernels/cpu/embedding_bag.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/embedding_bag_impl.h"

namespace loom::kernels::cpu {

namespace {

using detail::F32xV;
using detail::kLanes;
using detail::resolve_row;

constexpr int kTileVectors = 8;         // 8 * kLanes columns summed per pass over a bag's rows
constexpr int64_t kPrefetchAhead = 32;  // lookups ahead whose rows are prefetched

// Note [Embedding prefetch level]
// Rows are prefetched into L2 (locality 1: prefetcht2), not L1 (prefetcht0 / prefetchnta). Each
// core can track few L1 misses at once, and a lookup's 8+ lines times kPrefetchAhead lookups
// exhausted them, so prefetches to L1 queued behind each other; L2 tracks many more. On the
// 2-core Zen 4 VM at FBGEMM's default shape the forward went from 10.4-11.4 ms (locality 3 or 0,
// 24 ahead) to 6.4-6.6 ms (locality 1, 32 ahead); 16 ahead was 8.2-8.6 ms, 48 no better than 32.
template <typename W>
inline void prefetch_row(const W* row, int64_t dim) {
  detail::prefetch_lines<1>(row, dim * int64_t(sizeof(W)));
}

// Note [Embedding tile width]
// A tile is kTileVectors vectors of the target's own width (detail::kLanes: 16 floats with
// AVX-512, 8 with AVX2), not always 16 floats. GCC 12 lowers a 64-byte generic vector on an AVX2
// target to pairs of ymm whose halves round-trip through the stack on every add; on the 2-core
// Zen 3 VM (AVX2 only) at FBGEMM's default shape that forward took 48-65 ms against
// torch.nn.EmbeddingBag's 25-33 ms, and 20-31 ms with 8-float vectors (a 64-column tile; a
// 128-column row takes two passes, the second over rows already in L1), 18-20 ms once the
// look-ahead prefetches were really emitted (Note [Prefetches the compiler drops]). There, 8-64
// lookups ahead at locality 0, 1 or 3, and no prefetch at all, all measured 18.3-23.5 ms, within
// this VM's noise: its out-of-order core overlaps the rows by itself. The settings above stay for
// the machine they were measured on.

// One bag's lookups, as each pass over a column tile reads them straight from the indices:
// positions [begin, end) of table's lookups, the bounds-check mode, and the per-sample weights
// (or none). The rows of the lookups ahead are prefetched (first pass only) up to table_end.
template <typename W, typename Index>
struct BagLookups {
  const W* table;  // row 0, column 0
  int64_t num_rows, dim;
  const Index* indices;
  const float* psw;
  int64_t begin, end, table_end;
  EmbeddingBoundsCheck mode;

  float weight(int64_t p) const { return psw ? psw[p] : 1.0f; }
  void prefetch_ahead(int64_t p) const {
    const int64_t q = p + kPrefetchAhead;
    if (q >= table_end) return;
    const int64_t r = resolve_row(int64_t(indices[q]), num_rows, mode);
    if (r >= 0) prefetch_row(table + r * dim, dim);
  }
};

// out[c0, c0 + kLanes*N) = scale * sum over the bag's valid lookups p of weight(p) *
// row(p)[c0, c0 + kLanes*N), in N vector registers; the rows are read in lookup order.
// The first pass prefetches the rows further on.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // inline vector helpers: see embedding_bag_impl.h
template <int N, typename W, typename Index>
void pool_tile(const BagLookups<W, Index>& bag, int64_t c0, bool first_pass, float scale,
               float* out) {
  F32xV acc[N] = {};
  for (int64_t p = bag.begin; p < bag.end; ++p) {
    if (first_pass) bag.prefetch_ahead(p);
    const int64_t r = resolve_row(int64_t(bag.indices[p]), bag.num_rows, bag.mode);
    if (r < 0) continue;
    const W* row = bag.table + r * bag.dim + c0;
    const float w = bag.weight(p);
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) acc[i] += w * detail::load_lanes(row + kLanes * i);
  }
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) detail::store_lanes(out + c0 + kLanes * i, acc[i] * scale);
}

#pragma GCC diagnostic pop

// pool_tile<vectors> for a run-time vectors in [1, N]: the columns left after the full tiles.
template <int N, typename W, typename Index>
void pool_vectors(int64_t vectors, const BagLookups<W, Index>& bag, int64_t c0, bool first_pass,
                  float scale, float* out) {
  if constexpr (N > 0) {
    if (vectors == N) return pool_tile<N>(bag, c0, first_pass, scale, out);
    pool_vectors<N - 1>(vectors, bag, c0, first_pass, scale, out);
  }
}

// The last dim % kLanes columns, [c0, dim) (4, 8 or 12: dims are multiples of 4).
template <typename W, typename Index>
void pool_tail(const BagLookups<W, Index>& bag, int64_t c0, float scale, float* out) {
  const int64_t width = bag.dim - c0;
  float acc[12] = {};
  for (int64_t p = bag.begin; p < bag.end; ++p) {
    const int64_t r = resolve_row(int64_t(bag.indices[p]), bag.num_rows, bag.mode);
    if (r >= 0) detail::axpy_row(acc, bag.table + r * bag.dim + c0, bag.weight(p), width);
  }
  for (int64_t c = 0; c < width; ++c) out[c0 + c] = acc[c] * scale;
}

// Sum (weighted, or mean) of one bag's rows into out[0, dim), each element written once, tile
// by tile; returns the bad indices met. A first pass over the indices counts the bad ones and
// the valid ones (for the mean); each tile pass reads the lookups from the indices, in order
// (a bag's indices stay in L1 between passes). Rows are prefetched kPrefetchAhead lookups ahead,
// on into the next bags up to table_end (the next bags of a table usually come next on the same
// thread), so a bag's first rows are on their way before it starts.
//
// Note [Embedding lookups read in place]
// The tile passes used to read a scratch list of row offsets and weights, gathered (bounds
// resolved, the bag's rows prefetched once more) in a pass of their own. Reading the indices in
// place needs no per-thread scratch and measured a little faster: 1.07 against 1.09 times a
// hand-written single-pass loop's forward at FBGEMM's default shape, timed in turn in one process
// on the 2-vCPU Zen 5 VM (the larger gain there was Note [Prefetch loops], embedding_bag_impl.h).
template <typename W, typename Index>
int64_t pool_bag(const BagLookups<W, Index>& bag, bool mean, float* out) {
  int64_t bad = 0, valid = 0;
  for (int64_t p = bag.begin; p < bag.end; ++p) {
    const int64_t index = int64_t(bag.indices[p]);
    bad += static_cast<uint64_t>(index) >= static_cast<uint64_t>(bag.num_rows);
    valid += resolve_row(index, bag.num_rows, bag.mode) >= 0;
  }
  const float scale = mean && valid > 0 ? 1.0f / float(valid) : 1.0f;
  constexpr int64_t kTile = kLanes * kTileVectors;
  int64_t c0 = 0;
  for (; c0 + kTile <= bag.dim; c0 += kTile) pool_tile<kTileVectors>(bag, c0, c0 == 0, scale, out);
  const int64_t vectors = (bag.dim - c0) / kLanes;
  pool_vectors<kTileVectors - 1>(vectors, bag, c0, c0 == 0, scale, out);
  c0 += kLanes * vectors;
  if (c0 < bag.dim) pool_tail(bag, c0, scale, out);
  return bad;
}

// kNone: lookup p's row, converted to f32, at its packed place.
template <typename W, typename Index>
void copy_bag(const W* table, int64_t rows, int64_t dim, const Index* indices, int64_t begin,
              int64_t end, EmbeddingBoundsCheck mode, float* out, int64_t* bad) {
  for (int64_t p = begin; p < end; ++p, out += dim) {
    const int64_t r = resolve_row(int64_t(indices[p]), rows, mode);
    if (static_cast<uint64_t>(indices[p]) >= static_cast<uint64_t>(rows)) ++*bad;
    if (r < 0) {
      std::memset(out, 0, size_t(dim) * sizeof(float));
      continue;
    }
    const W* row = table + r * dim;
    for (int64_t c = 0; c < dim; ++c) out[c] = detail::to_f32(row[c]);
  }
}

template <typename W, typename Index>
int64_t forward_impl(const EmbeddingTables& tables, const W* weights,
                     const EmbeddingBagIndices<Index>& in, float* out,
                     const EmbeddingBagOptions& opt) {
  const int64_t nt = tables.num_tables, nb = in.batch_size, bags = nt * nb;
  const int64_t total_dim = tables.dim_offsets[nt];
  const bool unpooled = opt.pooling == EmbeddingPooling::kNone;
  const bool mean = opt.pooling == EmbeddingPooling::kMean;
  const float* psw = opt.pooling == EmbeddingPooling::kSum ? in.per_sample_weights : nullptr;
  std::vector<int64_t> packed;
  if (unpooled) packed = detail::packed_offsets(tables, in);
  int64_t bad = 0;
#pragma omp parallel for schedule(dynamic, 16) reduction(+ : bad) if (bags > 64)
  for (int64_t tb = 0; tb < bags; ++tb) {
    const int64_t t = tb / nb, b = tb % nb;
    const int64_t dim = tables.dims[t], rows = tables.rows[t];
    const W* table = weights + tables.weight_offsets[t];
    const int64_t begin = int64_t(in.offsets[tb]), end = int64_t(in.offsets[tb + 1]);
    if (unpooled) {
      const int64_t first = int64_t(in.offsets[t * nb]);
      float* dst = out + packed[size_t(t)] + (begin - first) * dim;
      copy_bag(table, rows, dim, in.indices, begin, end, opt.bounds_check, dst, &bad);
    } else {
      float* dst = out + b * total_dim + tables.dim_offsets[t];
      const int64_t table_end = int64_t(in.offsets[(t + 1) * nb]);
      const BagLookups<W, Index> bag{table, rows, dim,       in.indices,      psw,
                                     begin, end,  table_end, opt.bounds_check};
      bad += pool_bag(bag, mean, dst);
    }
  }
  return bad;
}

EmbeddingBagError make_error(EmbeddingBagErrorKind kind, int64_t table, int64_t bag,
                             int64_t position, int64_t value, int64_t expected) {
  EmbeddingBagError e;
  e.kind = kind;
  e.table = table;
  e.bag = bag;
  e.position = position;
  e.value = value;
  e.expected = expected;
  return e;
}

}  // namespace

template <typename Index>
EmbeddingBagError validate_embedding_bag(const EmbeddingTables& tables,
                                         const EmbeddingBagIndices<Index>& in,
                                         const EmbeddingBagOptions& opt) {
  using Kind = EmbeddingBagErrorKind;
  const int64_t nt = tables.num_tables, nb = in.batch_size;
  for (int64_t t = 0; t < nt; ++t) {
    if (tables.dims[t] <= 0 || tables.dims[t] % 4 != 0)
      return make_error(Kind::kBadTable, t, -1, -1, tables.dims[t], 4);
    if (tables.rows[t] < 0) return make_error(Kind::kBadTable, t, -1, -1, tables.rows[t], 0);
  }
  if (nb < 0 || in.num_offsets != nt * nb + 1)
    return make_error(Kind::kWrongLength, -1, -1, -1, in.num_offsets, nt * nb + 1);
  if (in.num_indices < 0) return make_error(Kind::kWrongLength, -1, -1, -1, in.num_indices, 0);
  if (in.per_sample_weights) {
    if (in.num_per_sample_weights != in.num_indices)
      return make_error(Kind::kWrongLength, -1, -1, -1, in.num_per_sample_weights, in.num_indices);
    if (opt.pooling != EmbeddingPooling::kSum)
      return make_error(Kind::kWeightsNeedSum, -1, -1, -1, 0, 0);
  }
  uint64_t total_rows = 0;
  for (int64_t t = 0; t < nt; ++t) total_rows += uint64_t(tables.rows[t]);
  if (const EmbeddingBagError key = embedding_bag_sort_key_check(total_rows, in.num_indices);
      !key.ok())
    return key;
  const Index* off = in.offsets;
  if (off[0] != 0) return make_error(Kind::kFirstOffsetNotZero, 0, 0, 0, int64_t(off[0]), 0);
  const int64_t bags = nt * nb;
  for (int64_t p = 1; p <= bags; ++p)
    if (off[p] < off[p - 1])  // bag p-1 would have a negative length
      return make_error(Kind::kDecreasingOffsets, (p - 1) / nb, (p - 1) % nb, p, int64_t(off[p]),
                        int64_t(off[p - 1]));
  if (int64_t(off[bags]) != in.num_indices)
    return make_error(Kind::kLastOffsetMismatch, nt - 1, nb - 1, bags, int64_t(off[bags]),
                      in.num_indices);
  if (opt.bounds_check != EmbeddingBoundsCheck::kError) return {};

  // Every index against its table's rows; the lowest bad position wins whatever the threads.
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t begin = int64_t(off[t * nb]), end = int64_t(off[(t + 1) * nb]);
    const uint64_t rows = uint64_t(tables.rows[t]);
    int64_t first = end;
#pragma omp parallel for schedule(static) reduction(min : first) if (end - begin > (1 << 15))
    for (int64_t p = begin; p < end; ++p)
      if (static_cast<uint64_t>(in.indices[p]) >= rows && p < first) first = p;
    if (first == end) continue;
    // The bag: the last b with offsets[t*B+b] <= first (empty bags share their offset).
    const Index* bag_end = std::upper_bound(off + t * nb, off + (t + 1) * nb, Index(first));
    const int64_t bag = int64_t(bag_end - (off + t * nb)) - 1;
    const int64_t value = int64_t(in.indices[first]);
    return make_error(value < 0 ? Kind::kNegativeIndex : Kind::kIndexOutOfRange, t, bag, first,
                      value, tables.rows[t]);
  }
  return {};
}

template <typename Index>
int64_t embedding_bag_packed_size(const EmbeddingTables& tables,
                                  const EmbeddingBagIndices<Index>& in) {
  return detail::packed_offsets(tables, in)[size_t(tables.num_tables)];
}

template <typename Index>
int64_t embedding_bag_forward(const EmbeddingTables& tables, const void* weights,
                              const EmbeddingBagIndices<Index>& in, float* out,
                              const EmbeddingBagOptions& opt) {
  return detail::dispatch_dtype(tables.dtype, [&](auto w) {
    using W = decltype(w);
    return forward_impl(tables, static_cast<const W*>(weights), in, out, opt);
  });
}

#define LOOM_EMBEDDING_BAG_FORWARD(Index)                                                     \
  template EmbeddingBagError validate_embedding_bag<Index>(                                   \
      const EmbeddingTables&, const EmbeddingBagIndices<Index>&, const EmbeddingBagOptions&); \
  template int64_t embedding_bag_packed_size<Index>(const EmbeddingTables&,                   \
                                                    const EmbeddingBagIndices<Index>&);       \
  template int64_t embedding_bag_forward<Index>(const EmbeddingTables&, const void*,          \
                                                const EmbeddingBagIndices<Index>&, float*,    \
                                                const EmbeddingBagOptions&);
LOOM_EMBEDDING_BAG_FORWARD(int32_t)
LOOM_EMBEDDING_BAG_FORWARD(int64_t)
#undef LOOM_EMBEDDING_BAG_FORWARD

}  // namespace loom::kernels::cpu
