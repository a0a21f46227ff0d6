// Groups an embedding-bag batch's lookups by (table, row) for the backward
// (embedding_bag_backward.cpp): every lookup gets the key base[t] + row, and (key, position) pairs
// are sorted with a stable LSD radix sort; equal keys form a segment.
//
// Note [Deterministic embedding backward]
// A stable sort's output is unique, so it does not depend on how the OpenMP threads split the
// work, and within a row the lookups keep index order. The backward reduces each segment on one
// thread in that order, so its results are the same bits for every run and every thread count.
#include <algorithm>
#include <vector>

#include "kernels/cpu/embedding_bag_impl.h"

#if defined(_OPENMP)
#include <omp.h>
#else
static int omp_get_max_threads() { return 1; }
static int omp_get_num_threads() { return 1; }
static int omp_get_thread_num() { return 0; }
#endif

namespace loom::kernels::cpu::detail {

namespace {

// Note [Embedding backward threads]
// Keying, sorting and finding segments are a few passes over 8-byte words; at FBGEMM's benchmark
// shape (327680 lookups) they take about 3 ms on one thread. An OpenMP region costs microseconds
// on an idle machine, but on a shared one each region and barrier can wait a scheduler tick
// (4 ms) for a preempted thread: on the 2-core development VM, with other jobs running, the
// 2-thread sort took 30 ms where one thread took 2 ms. So these passes run on the calling thread
// below these sizes, and only the per-row reduction and update (the bulk of the bytes) is spread
// over the threads.
constexpr int64_t kParallelKeys = int64_t(1) << 21;
constexpr int64_t kParallelSort = int64_t(1) << 22;

// Note [Embedding backward workspace]
// The sort and the segment list need about 40 bytes per lookup. Allocated per call, glibc returns
// buffers this large to the OS on free, and every call would page-fault (and zero) them again, so
// each calling thread keeps its buffers and only grows them.
struct Workspace {
  std::vector<uint64_t> sorted, tmp;  // (key << pos_bits) | position, and the sort's other half
  std::vector<int64_t> bag_of;        // [num_indices] t*B+b of each lookup
  std::vector<int64_t> bag;           // [num_indices] the same in sorted order
  std::vector<int64_t> seg_start;     // [num_segments + 1]
  std::vector<int32_t> seg_table;     // [num_segments]
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
  const int max_threads = n > kParallelSort ? omp_get_max_threads() : 1;
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

}  // namespace

template <typename Index>
Segments make_segments(const EmbeddingTables& tables, const EmbeddingBagIndices<Index>& in,
                       const EmbeddingBagOptions& opt) {
  Workspace& w = workspace();
  const int64_t nt = tables.num_tables, nb = in.batch_size, bags = nt * nb, n = in.num_indices;
  Segments s;
  s.base.assign(size_t(nt) + 1, 0);
  for (int64_t t = 0; t < nt; ++t)
    s.base[size_t(t) + 1] = s.base[size_t(t)] + uint64_t(tables.rows[t]);
  const uint64_t skipped = s.base[size_t(nt)];  // sorts after every real row, then dropped
  s.pos_bits = embedding_bit_width(uint64_t(std::max<int64_t>(n - 1, 0)));
  const int key_bits = embedding_bit_width(skipped);
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
#pragma omp parallel for schedule(dynamic, 64) if (n > kParallelKeys)
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
  s.bag_scale = bag_scale;

  // Segment starts: where the key changes, before the skipped lookups (sorted last). Threads
  // count the starts in their chunk, then write them at their prefix, with each segment's table.
  const int64_t end = std::lower_bound(s.sorted, s.sorted + n, skipped << s.pos_bits) - s.sorted;
  int64_t* seg_start = grow(w.seg_start, end + 1);
  int32_t* seg_table = grow(w.seg_table, end);
  const int max_threads = end > kParallelSort ? omp_get_max_threads() : 1;
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
    size_t t = 0;  // the table of key(i): keys only grow, and every key < base[nt] = skipped
    for (int64_t i = begin; i < stop; ++i)
      if (starts(i)) {
        while (s.key(i) >= s.base[t + 1]) ++t;
        seg_table[at] = int32_t(t);
        seg_start[at++] = i;
      }
#pragma omp single
    s.segments = chunk_counts[nth];
  }
  seg_start[s.segments] = end;
  s.seg_start = seg_start;
  s.seg_table = seg_table;

  // Each sorted entry's bag, gathered once here (independent loads the core overlaps) so that the
  // backward reads it in order instead of through position() (a chain of two random loads).
  int64_t* bag = grow(w.bag, end);
#pragma omp parallel for schedule(static) if (end > kParallelKeys)
  for (int64_t i = 0; i < end; ++i) bag[i] = bag_of[s.position(i)];
  s.bag = bag;
  return s;
}

template Segments make_segments<int32_t>(const EmbeddingTables&,
                                         const EmbeddingBagIndices<int32_t>&,
                                         const EmbeddingBagOptions&);
template Segments make_segments<int64_t>(const EmbeddingTables&,
                                         const EmbeddingBagIndices<int64_t>&,
                                         const EmbeddingBagOptions&);

}  // namespace loom::kernels::cpu::detail
