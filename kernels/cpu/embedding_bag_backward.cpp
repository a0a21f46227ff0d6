// Table-batched embedding-bag backward on the CPU: dense or sparse gradient, or a fused
// optimizer update that never materialises the weight gradient.
//
// Note [Deterministic embedding backward]
// Lookups are keyed by (table, row) and sorted with a stable LSD radix sort. A stable sort's
// output is unique, so it does not depend on how the OpenMP threads split the work; within a
// row, lookups keep index order. Each unique row (a segment of the sorted list) is then reduced
// by one thread, adding its lookups' output gradients in that order into a local f32 row, and
// that row is written out or applied by the optimizer. No two threads touch one row, so there are
// no atomics, and the bits are the same for every run and every thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/embedding_bag.h"
#include "kernels/cpu/embedding_bag_impl.h"

#if defined(_OPENMP)
#include <omp.h>
#else
static int omp_get_max_threads() { return 1; }
static int omp_get_num_threads() { return 1; }
static int omp_get_thread_num() { return 0; }
#endif

namespace loom::kernels::cpu {

namespace {

using detail::resolve_row;

int bit_width(uint64_t x) {
  int bits = 0;
  while (x >> bits) ++bits;
  return bits;
}

// Note [Embedding backward workspace]
// The sort and the segment list need about 40 bytes per lookup. Allocated per call, glibc hands
// such buffers back to the kernel on free and every call page-faults them in again (a fifth of the
// backward's time at FBGEMM's benchmark shape), so each calling thread keeps its buffers and only
// grows them.
struct Workspace {
  std::vector<uint64_t> sorted, tmp;  // (key << pos_bits) | position, and the sort's other half
  std::vector<int64_t> bag_of;        // [num_indices] t*B+b of each lookup
  std::vector<int64_t> seg_start;     // [num_segments + 1]
  std::vector<float> bag_scale;       // [T*B] 1 / len (mean pooling)
  std::vector<int64_t> counts;        // the sort's per-thread histograms
};

Workspace& workspace() {
  static thread_local Workspace w;
  return w;
}

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (v.size() < size_t(n)) v.resize(size_t(n));
  return v.data();
}

// Stable LSD radix sort of a[0, n) by bits [lo, hi), digits of at most 11 bits, tmp the other
// buffer. Threads take contiguous chunks and scatter in chunk order, so the result is the unique
// stable order whatever the thread count. Returns the buffer that holds the result.
uint64_t* radix_sort(uint64_t* a, uint64_t* tmp, int64_t n, int lo, int hi,
                     std::vector<int64_t>& counts) {
  if (hi <= lo || n < 2) return a;
  const int passes = (hi - lo + 10) / 11;
  const int digit_bits = (hi - lo + passes - 1) / passes;
  const int64_t buckets = int64_t(1) << digit_bits;
  const uint64_t mask = uint64_t(buckets - 1);
  const int max_threads = n > (1 << 15) ? omp_get_max_threads() : 1;
  int64_t* all_counts = grow(counts, max_threads * buckets);
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = lo + pass * digit_bits;
#pragma omp parallel num_threads(max_threads)
    {
      const int nth = omp_get_num_threads(), tid = omp_get_thread_num();
      const int64_t chunk = (n + nth - 1) / nth;
      const int64_t begin = std::min(n, tid * chunk), end = std::min(n, begin + chunk);
      int64_t* mine = all_counts + tid * buckets;
      std::fill(mine, mine + buckets, 0);
      for (int64_t i = begin; i < end; ++i) ++mine[(a[i] >> shift) & mask];
#pragma omp barrier
#pragma omp single
      {
        int64_t sum = 0;  // exclusive prefix in (digit, thread) order
        for (int64_t d = 0; d < buckets; ++d)
          for (int th = 0; th < nth; ++th) {
            const int64_t c = all_counts[th * buckets + d];
            all_counts[th * buckets + d] = sum;
            sum += c;
          }
      }
      for (int64_t i = begin; i < end; ++i) tmp[mine[(a[i] >> shift) & mask]++] = a[i];
    }
    std::swap(a, tmp);
  }
  return a;
}

// Lookups grouped by (table, row): sorted entries [seg_start[k], seg_start[k+1]) are segment k,
// in index order. See Note [Deterministic embedding backward].
struct Segments {
  const uint64_t* sorted = nullptr;  // [num_indices]: (key << pos_bits) | position
  int pos_bits = 0;
  const int64_t* seg_start = nullptr;
  int64_t segments = 0;
  const int64_t* bag_of = nullptr;
  const float* bag_scale = nullptr;
  std::vector<uint64_t> base;  // [T+1] first key of table t: key = base[t] + row

  int64_t position(int64_t i) const { return int64_t(sorted[i] & ((uint64_t(1) << pos_bits) - 1)); }
  uint64_t key(int64_t i) const { return sorted[i] >> pos_bits; }
  int64_t table(int64_t k) const {
    return int64_t(std::upper_bound(base.begin(), base.end(), key(seg_start[k])) - base.begin()) -
           1;
  }
  int64_t row(int64_t k, int64_t t) const { return int64_t(key(seg_start[k]) - base[size_t(t)]); }
};

// Keys every lookup, sorts, and finds the segments, in w (the calling thread's workspace).
template <typename Index>
Segments make_segments(const EmbeddingTables& tables, const EmbeddingBagIndices<Index>& in,
                       const EmbeddingBagOptions& opt, Workspace& w) {
  const int64_t nt = tables.num_tables, nb = in.batch_size, bags = nt * nb, n = in.num_indices;
  Segments s;
  s.base.assign(size_t(nt) + 1, 0);
  for (int64_t t = 0; t < nt; ++t)
    s.base[size_t(t) + 1] = s.base[size_t(t)] + uint64_t(tables.rows[t]);
  const uint64_t skipped = s.base[size_t(nt)];  // sorts after every real row, then dropped
  s.pos_bits = bit_width(uint64_t(std::max<int64_t>(n - 1, 0)));
  const int key_bits = bit_width(skipped);
  // Key and position share one word (2^40 rows with 2^24 lookups still fit); validation rejects
  // batches where they do not, and such a batch has no rows here rather than wrong ones.
  if (key_bits + s.pos_bits > 64) {
    s.seg_start = grow(w.seg_start, 1);
    w.seg_start[0] = 0;
    return s;
  }
  uint64_t* sorted = grow(w.sorted, n);
  int64_t* bag_of = grow(w.bag_of, n);
  const bool mean = opt.pooling == EmbeddingPooling::kMean;
  float* bag_scale = mean ? grow(w.bag_scale, bags) : nullptr;
#pragma omp parallel for schedule(dynamic, 64) if (n > (1 << 14))
  for (int64_t tb = 0; tb < bags; ++tb) {
    const int64_t t = tb / nb, rows = tables.rows[t];
    int64_t counted = 0;
    for (int64_t p = int64_t(in.offsets[tb]); p < int64_t(in.offsets[tb + 1]); ++p) {
      const int64_t r = resolve_row(int64_t(in.indices[p]), rows, opt.bounds_check);
      const uint64_t key = r < 0 ? skipped : s.base[size_t(t)] + uint64_t(r);
      counted += r >= 0;
      sorted[p] = (key << s.pos_bits) | uint64_t(p);
      bag_of[p] = tb;
    }
    if (mean) bag_scale[tb] = counted > 0 ? 1.0f / float(counted) : 0.0f;
  }
  s.sorted = radix_sort(sorted, grow(w.tmp, n), n, s.pos_bits, s.pos_bits + key_bits, w.counts);
  s.bag_of = bag_of;
  s.bag_scale = bag_scale;

  // Segment starts: where the key changes, before the skipped lookups (sorted last). Threads
  // count the starts in their chunk, then write them at their prefix.
  const int64_t end = std::lower_bound(s.sorted, s.sorted + n, skipped << s.pos_bits) - s.sorted;
  int64_t* seg_start = grow(w.seg_start, end + 1);
  const int max_threads = end > (1 << 15) ? omp_get_max_threads() : 1;
  int64_t* chunk_counts = grow(w.counts, max_threads + 1);
#pragma omp parallel num_threads(max_threads)
  {
    const int nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t chunk = (end + nth - 1) / nth;
    const int64_t begin = std::min(end, tid * chunk), stop = std::min(end, begin + chunk);
    auto starts = [&](int64_t i) { return i == 0 || s.key(i) != s.key(i - 1); };
    int64_t count = 0;
    for (int64_t i = begin; i < stop; ++i) count += starts(i);
    chunk_counts[tid + 1] = count;
#pragma omp barrier
#pragma omp single
    {
      chunk_counts[0] = 0;
      for (int th = 0; th < nth; ++th) chunk_counts[th + 1] += chunk_counts[th];
    }
    int64_t at = chunk_counts[tid];
    for (int64_t i = begin; i < stop; ++i)
      if (starts(i)) seg_start[at++] = i;
#pragma omp single
    s.segments = chunk_counts[nth];
  }
  seg_start[s.segments] = end;
  s.seg_start = seg_start;
  return s;
}

// g[0, dim) = the reduced output gradient of segment k of table t (=, in index order).
template <typename Index>
void reduce_segment(const Segments& s, int64_t k, int64_t t, const EmbeddingTables& tables,
                    const EmbeddingBagIndices<Index>& in, const float* dout,
                    const std::vector<int64_t>& packed, const EmbeddingBagOptions& opt, float* g) {
  const int64_t dim = tables.dims[t], nb = in.batch_size;
  const int64_t total_dim = tables.dim_offsets[tables.num_tables];
  const float* psw = opt.pooling == EmbeddingPooling::kSum ? in.per_sample_weights : nullptr;
  const bool mean = opt.pooling == EmbeddingPooling::kMean;
  std::fill(g, g + dim, 0.0f);
  for (int64_t i = s.seg_start[k]; i < s.seg_start[k + 1]; ++i) {
    const int64_t p = s.position(i);
    const int64_t bag = s.bag_of[p];
    const float* drow;
    if (opt.pooling == EmbeddingPooling::kNone)
      drow = dout + packed[size_t(t)] + (p - int64_t(in.offsets[t * nb])) * dim;
    else
      drow = dout + (bag - t * nb) * total_dim + tables.dim_offsets[t];
    const float scale = psw ? psw[p] : mean ? s.bag_scale[bag] : 1.0f;
    detail::axpy_row(g, drow, scale, dim);
  }
}

// grad_psw[p] = dot(dout[bag, table's columns], weight row of p), 0 for skipped lookups.
template <typename W, typename Index>
void per_sample_weight_grad(const EmbeddingTables& tables, const W* weights,
                            const EmbeddingBagIndices<Index>& in, const float* dout,
                            const EmbeddingBagOptions& opt, float* grad_psw) {
  const int64_t nt = tables.num_tables, nb = in.batch_size, bags = nt * nb;
  const int64_t total_dim = tables.dim_offsets[nt];
#pragma omp parallel for schedule(dynamic, 64) if (in.num_indices > (1 << 12))
  for (int64_t tb = 0; tb < bags; ++tb) {
    const int64_t t = tb / nb, b = tb % nb, dim = tables.dims[t];
    const float* drow = dout + b * total_dim + tables.dim_offsets[t];
    const W* table = weights + tables.weight_offsets[t];
    for (int64_t p = int64_t(in.offsets[tb]); p < int64_t(in.offsets[tb + 1]); ++p) {
      const int64_t r = resolve_row(int64_t(in.indices[p]), tables.rows[t], opt.bounds_check);
      grad_psw[p] = r < 0 ? 0.0f : detail::dot_row(drow, table + r * dim, dim);
    }
  }
}

template <typename Index>
void maybe_psw_grad(const EmbeddingTables& tables, const void* weights,
                    const EmbeddingBagIndices<Index>& in, const float* dout,
                    const EmbeddingBagOptions& opt, float* grad_psw) {
  if (!grad_psw) return;
  if (opt.pooling != EmbeddingPooling::kSum) {  // validation rejects weights here; stay defined
    std::fill(grad_psw, grad_psw + in.num_indices, 0.0f);
    return;
  }
  detail::dispatch_dtype(tables.dtype, [&](auto w) {
    using W = decltype(w);
    per_sample_weight_grad(tables, static_cast<const W*>(weights), in, dout, opt, grad_psw);
  });
}

int64_t max_dim(const EmbeddingTables& tables) {
  int64_t d = 0;
  for (int64_t t = 0; t < tables.num_tables; ++t) d = std::max(d, tables.dims[t]);
  return d;
}

// Calls emit(k, t, row, g) for every segment k (table t, row) with its reduced gradient row g,
// segments spread over the threads (each segment on one thread). prefetch(k, t, row) is called
// kSegmentsAhead segments before emit, for the memory emit will touch.
static const int64_t kSegmentsAhead = getenv("EBK_SA") ? atoi(getenv("EBK_SA")) : 4;

template <typename Index, typename Emit, typename Prefetch>
void for_each_segment(const Segments& s, const EmbeddingTables& tables,
                      const EmbeddingBagIndices<Index>& in, const float* dout,
                      const EmbeddingBagOptions& opt, Emit&& emit, Prefetch&& prefetch) {
  std::vector<int64_t> packed;
  if (opt.pooling == EmbeddingPooling::kNone) packed = detail::packed_offsets(tables, in);
  const int64_t segments = s.segments, dim = max_dim(tables);
#pragma omp parallel if (segments > 256)
  {
    std::vector<float> g(static_cast<size_t>(dim));
#pragma omp for schedule(dynamic, 256)
    for (int64_t k = 0; k < segments; ++k) {
      if (k + kSegmentsAhead < segments) {
        const int64_t ahead = k + kSegmentsAhead, t = s.table(ahead);
        prefetch(ahead, t, s.row(ahead, t));
      }
      const int64_t t = s.table(k);
      reduce_segment(s, k, t, tables, in, dout, packed, opt, g.data());
      emit(k, t, s.row(k, t), g.data());
    }
  }
}

template <typename T>
void prefetch_bytes(const T* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64)
    __builtin_prefetch(reinterpret_cast<const char*>(p) + b, 1, 0);
}

// The fused update of one row w[0, dim) with its gradient g (f32 arithmetic, one rounding to W).
// See EmbeddingOptimizerHyper for the formulas.
template <typename W>
void update_row(W* w, float* g, int64_t dim, const EmbeddingOptimizerHyper& h, float* row_state,
                float* m, float* v, float bias1, float bias2) {
  const float lr = h.lr, eps = h.eps, wd = h.weight_decay;
  switch (h.kind) {
    case EmbeddingOptimizer::kNone:
      return;
    case EmbeddingOptimizer::kSgd:
      for (int64_t c = 0; c < dim; ++c) {
        const float wf = detail::to_f32(w[c]);
        detail::from_f32(wf - lr * (g[c] + wd * wf), w + c);
      }
      return;
    case EmbeddingOptimizer::kRowwiseAdagrad: {
      float sum_sq = 0.0f;
      for (int64_t c = 0; c < dim; ++c) {
        if (wd != 0.0f) g[c] += wd * detail::to_f32(w[c]);
        sum_sq += g[c] * g[c];
      }
      const float state = *row_state + sum_sq / float(dim);
      *row_state = state;
      const float multiplier = lr / (std::sqrt(state) + eps);
      for (int64_t c = 0; c < dim; ++c)
        detail::from_f32(detail::to_f32(w[c]) - multiplier * g[c], w + c);
      return;
    }
    case EmbeddingOptimizer::kAdam: {
      const float b1 = h.beta1, b2 = h.beta2;
      for (int64_t c = 0; c < dim; ++c) {
        const float wf = detail::to_f32(w[c]);
        const float mc = b1 * m[c] + (1.0f - b1) * g[c];
        const float vc = b2 * v[c] + (1.0f - b2) * g[c] * g[c];
        m[c] = mc;
        v[c] = vc;
        const float step = (mc / bias1) / (std::sqrt(vc / bias2) + eps) + wd * wf;
        detail::from_f32(wf - lr * step, w + c);
      }
      return;
    }
  }
}

template <typename W, typename Index>
void fused_impl(const EmbeddingTables& tables, W* weights, const EmbeddingBagIndices<Index>& in,
                const float* dout, const EmbeddingOptimizerHyper& h,
                const EmbeddingOptimizerState& state, const EmbeddingBagOptions& opt) {
  const Segments s = make_segments(tables, in, opt, workspace());
  const float bias1 = float(1.0 - std::pow(double(h.beta1), double(h.step)));
  const float bias2 = float(1.0 - std::pow(double(h.beta2), double(h.step)));
  const bool adam = h.kind == EmbeddingOptimizer::kAdam;
  const bool adagrad = h.kind == EmbeddingOptimizer::kRowwiseAdagrad;
  auto emit = [&](int64_t, int64_t t, int64_t r, float* g) {
    const int64_t dim = tables.dims[t], elem = tables.weight_offsets[t] + r * dim;
    float* row_state = adagrad ? state.momentum1 + tables.row_offsets[t] + r : nullptr;
    float* m = adam ? state.momentum1 + elem : nullptr;
    float* v = adam ? state.momentum2 + elem : nullptr;
    update_row(weights + elem, g, dim, h, row_state, m, v, bias1, bias2);
  };
  // The weight row and its state are random reads in memory far larger than the caches.
  auto prefetch = [&](int64_t, int64_t t, int64_t r) {
    const int64_t dim = tables.dims[t], elem = tables.weight_offsets[t] + r * dim;
    prefetch_bytes(weights + elem, dim * int64_t(sizeof(W)));
    if (adagrad) prefetch_bytes(state.momentum1 + tables.row_offsets[t] + r, 4);
    if (adam) {
      prefetch_bytes(state.momentum1 + elem, dim * 4);
      prefetch_bytes(state.momentum2 + elem, dim * 4);
    }
  };
  for_each_segment(s, tables, in, dout, opt, emit, prefetch);
}

}  // namespace

template <typename Index>
void embedding_bag_backward_dense(const EmbeddingTables& tables, const void* weights,
                                  const EmbeddingBagIndices<Index>& in, const float* dout,
                                  float* grad_weights, float* grad_per_sample_weights,
                                  const EmbeddingBagOptions& opt) {
  maybe_psw_grad(tables, weights, in, dout, opt, grad_per_sample_weights);
  for (int64_t t = 0; t < tables.num_tables; ++t) {
    float* block = grad_weights + tables.weight_offsets[t];
    const int64_t size = tables.rows[t] * tables.dims[t];
#pragma omp parallel for schedule(static) if (size > (1 << 16))
    for (int64_t i = 0; i < size; i += 4096)
      std::memset(block + i, 0, size_t(std::min<int64_t>(4096, size - i)) * sizeof(float));
  }
  const Segments s = make_segments(tables, in, opt, workspace());
  for_each_segment(
      s, tables, in, dout, opt,
      [&](int64_t, int64_t t, int64_t r, const float* g) {
        const int64_t dim = tables.dims[t];
        std::memcpy(grad_weights + tables.weight_offsets[t] + r * dim, g,
                    size_t(dim) * sizeof(float));
      },
      [](int64_t, int64_t, int64_t) {});
}

template <typename Index>
int64_t embedding_bag_backward_sparse(const EmbeddingTables& tables, const void* weights,
                                      const EmbeddingBagIndices<Index>& in, const float* dout,
                                      const EmbeddingSparseGrad& grad,
                                      float* grad_per_sample_weights,
                                      const EmbeddingBagOptions& opt) {
  maybe_psw_grad(tables, weights, in, dout, opt, grad_per_sample_weights);
  const Segments s = make_segments(tables, in, opt, workspace());
  grad.value_offsets[0] = 0;
  for (int64_t k = 0; k < s.segments; ++k) {
    const int64_t t = s.table(k);
    grad.tables[k] = t;
    grad.rows[k] = s.row(k, t);
    grad.value_offsets[k + 1] = grad.value_offsets[k] + tables.dims[t];
  }
  for_each_segment(
      s, tables, in, dout, opt,
      [&](int64_t k, int64_t t, int64_t, const float* g) {
        std::memcpy(grad.values + grad.value_offsets[k], g, size_t(tables.dims[t]) * sizeof(float));
      },
      [](int64_t, int64_t, int64_t) {});
  return s.segments;
}

template <typename Index>
void embedding_bag_backward_fused(const EmbeddingTables& tables, void* weights,
                                  const EmbeddingBagIndices<Index>& in, const float* dout,
                                  const EmbeddingOptimizerHyper& hyper,
                                  const EmbeddingOptimizerState& state,
                                  float* grad_per_sample_weights, const EmbeddingBagOptions& opt) {
  maybe_psw_grad(tables, weights, in, dout, opt, grad_per_sample_weights);  // before the update
  if (hyper.kind == EmbeddingOptimizer::kNone) return;
  detail::dispatch_dtype(tables.dtype, [&](auto w) {
    using W = decltype(w);
    fused_impl(tables, static_cast<W*>(weights), in, dout, hyper, state, opt);
  });
}

#define LOOM_EMBEDDING_BAG_BACKWARD(Index)                                                  \
  template void embedding_bag_backward_dense<Index>(                                        \
      const EmbeddingTables&, const void*, const EmbeddingBagIndices<Index>&, const float*, \
      float*, float*, const EmbeddingBagOptions&);                                          \
  template int64_t embedding_bag_backward_sparse<Index>(                                    \
      const EmbeddingTables&, const void*, const EmbeddingBagIndices<Index>&, const float*, \
      const EmbeddingSparseGrad&, float*, const EmbeddingBagOptions&);                      \
  template void embedding_bag_backward_fused<Index>(                                        \
      const EmbeddingTables&, void*, const EmbeddingBagIndices<Index>&, const float*,       \
      const EmbeddingOptimizerHyper&, const EmbeddingOptimizerState&, float*,               \
      const EmbeddingBagOptions&);
LOOM_EMBEDDING_BAG_BACKWARD(int32_t)
LOOM_EMBEDDING_BAG_BACKWARD(int64_t)
#undef LOOM_EMBEDDING_BAG_BACKWARD

}  // namespace loom::kernels::cpu
