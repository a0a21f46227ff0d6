// Table-batched embedding-bag backward on the CPU: dense or sparse gradient, or a fused
// optimizer update that never materialises the weight gradient. The lookups arrive grouped by
// (table, row) (embedding_bag_segments.cpp); each unique row (a segment) is reduced by one thread,
// adding its lookups' output gradients in index order into a local f32 row, and that row is
// written out or applied by the optimizer. No two threads touch one row, so there are no atomics,
// and the bits are the same for every run and every thread count
// (Note [Deterministic embedding backward]).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/embedding_bag.h"
#include "kernels/cpu/embedding_bag_impl.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace loom::kernels::cpu {

namespace {

using detail::resolve_row;
using detail::Segments;

// Reduces segments: the output gradient rows of a segment's lookups, scaled (per-sample weight,
// 1/len for mean), added in index order.
template <typename Index>
struct SegmentReducer {
  const Segments& s;
  const EmbeddingTables& tables;
  const EmbeddingBagIndices<Index>& in;
  const float* dout;  // the forward output's layout
  const EmbeddingBagOptions& opt;
  std::vector<int64_t> packed;  // kNone: where each table's lookups start in dout

  SegmentReducer(const Segments& segments, const EmbeddingTables& batch_tables,
                 const EmbeddingBagIndices<Index>& lookups, const float* grad_out,
                 const EmbeddingBagOptions& options)
      : s(segments), tables(batch_tables), in(lookups), dout(grad_out), opt(options) {
    if (opt.pooling == EmbeddingPooling::kNone) packed = detail::packed_offsets(tables, in);
  }

  // The output gradient row of sorted entry i (of table t).
  const float* dout_row(int64_t i, int64_t t) const {
    if (opt.pooling == EmbeddingPooling::kNone)
      return dout + packed[size_t(t)] +
             (s.position(i) - int64_t(in.offsets[t * in.batch_size])) * tables.dims[t];
    const int64_t b = s.bag[i] - t * in.batch_size;
    return dout + b * tables.dim_offsets[tables.num_tables] + tables.dim_offsets[t];
  }

  // g[0, dims[t]) = the reduced gradient of segment k (=).
  void reduce(int64_t k, int64_t t, float* g) const {
    const float* psw = opt.pooling == EmbeddingPooling::kSum ? in.per_sample_weights : nullptr;
    const bool mean = opt.pooling == EmbeddingPooling::kMean;
    const int64_t dim = tables.dims[t];
    std::fill(g, g + dim, 0.0f);
    for (int64_t i = s.seg_start[k]; i < s.seg_start[k + 1]; ++i) {
      const float scale = psw ? psw[s.position(i)] : mean ? s.bag_scale[s.bag[i]] : 1.0f;
      detail::axpy_row(g, dout_row(i, t), scale, dim);
    }
  }

  // Starts loading the output gradient rows segment k will read (its first few).
  void prefetch(int64_t k, int64_t t) const {
    const int64_t end = std::min(s.seg_start[k + 1], s.seg_start[k] + 4);
    for (int64_t i = s.seg_start[k]; i < end; ++i) {
      detail::prefetch_lines<3>(dout_row(i, t), tables.dims[t] * 4);
    }
  }
};

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
constexpr int64_t kSegmentsAhead = 16;

template <typename Index, typename Emit, typename Prefetch>
void for_each_segment(const Segments& s, const EmbeddingTables& tables,
                      const EmbeddingBagIndices<Index>& in, const float* dout,
                      const EmbeddingBagOptions& opt, Emit&& emit, Prefetch&& prefetch) {
  const SegmentReducer<Index> reducer(s, tables, in, dout, opt);
  const int64_t segments = s.segments, dim = max_dim(tables);
#pragma omp parallel if (segments > 256)
  {
    std::vector<float> g(static_cast<size_t>(dim));
#pragma omp for schedule(dynamic, 256)
    for (int64_t k = 0; k < segments; ++k) {
      if (k + kSegmentsAhead < segments) {
        const int64_t ahead = k + kSegmentsAhead, t = s.table(ahead);
        reducer.prefetch(ahead, t);
        prefetch(ahead, t, s.row(ahead, t));
      }
      const int64_t t = s.table(k);
      reducer.reduce(k, t, g.data());
      emit(k, t, s.row(k, t), g.data());
    }
#if defined(__SSE2__)
    _mm_sfence();  // stream_row's stores are visible before the region ends
#endif
  }
}

// dst[0, n) = src[0, n) (n a multiple of 4), with non-temporal stores where dst is 16-byte aligned:
// the sparse gradient is written once and read later by someone else, so fetching its lines into
// the cache first (as ordinary stores do) would double its memory traffic.
inline void stream_row(float* dst, const float* src, int64_t n) {
#if defined(__SSE2__)
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    for (int64_t c = 0; c < n; c += 4) _mm_stream_ps(dst + c, _mm_loadu_ps(src + c));
    return;
  }
#endif
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

// The rows the update will read and write are prefetched into L2 for reading, as the forward's
// (Note [Embedding prefetch level]), not with write intent: prefetchw fills L1, whose few miss
// buffers the look-ahead's rows exhausted. On the 2-core Zen 4 VM at FBGEMM's default shape,
// forward + backward + SGD went from 53.8-58.7 ms (write intent, locality 0, 8 segments ahead) to
// 41.3-45.2 ms (16 ahead), 0.69-0.73 -> 0.84-0.90 of the memory bound (loom-bench-embedding, old
// and new in turn); with read intent, 8 ahead measured 44-50 ms.
void prefetch_bytes(const void* p, int64_t bytes) { detail::prefetch_lines<1>(p, bytes); }

// v = its per-lane square roots (correctly rounded, as std::sqrt), kLanes per instruction (in
// place, not returned: a vector return warns of its ABI where the target lacks the width). The
// vector stays in a register: memcpy between same-sized vector types is a register move, where
// splitting a zmm into ymm halves through memory stalled every row on store forwarding (forward +
// backward + Adam 142-148 -> 96-106 ms on the Zen 4 VM, the prefetch change above included). GCC
// 12's _mm512_sqrt_ps trips -Wmaybe-uninitialized inside its header (_mm512_undefined_ps), hence
// the pragma.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
inline void sqrt_lanes(detail::F32xV& v) {
#if defined(__AVX512F__)
  static_assert(sizeof(__m512) == sizeof(detail::F32xV));
  __m512 x;
  std::memcpy(&x, &v, sizeof(x));
  x = _mm512_sqrt_ps(x);
  std::memcpy(&v, &x, sizeof(x));
#elif defined(__AVX__)
  static_assert(sizeof(__m256) == sizeof(detail::F32xV));
  __m256 x;
  std::memcpy(&x, &v, sizeof(x));
  x = _mm256_sqrt_ps(x);
  std::memcpy(&v, &x, sizeof(x));
#else
  for (int i = 0; i < detail::kLanes; ++i) v[i] = std::sqrt(v[i]);
#endif
}
#pragma GCC diagnostic pop

// Adam on one row, kLanes at a time: std::sqrt may set errno, which keeps compilers from
// vectorising it, and scalar divisions and square roots would dominate the row's time (with
// 4-lane SSE they still made the Adam step twice the SGD step on Zen 3).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // inline vector helpers: see embedding_bag_impl.h
void adam_row(float* w, const float* g, int64_t dim, const EmbeddingOptimizerHyper& h, float* m,
              float* v, float bias1, float bias2) {
  using detail::F32xV;
  using detail::kLanes;
  const float b1 = h.beta1, b2 = h.beta2;
  int64_t c = 0;
  for (; c + kLanes <= dim; c += kLanes) {
    const F32xV wv = detail::load_lanes(w + c), gv = detail::load_lanes(g + c);
    const F32xV mv = b1 * detail::load_lanes(m + c) + (1.0f - b1) * gv;
    const F32xV vv = b2 * detail::load_lanes(v + c) + (1.0f - b2) * gv * gv;
    detail::store_lanes(m + c, mv);
    detail::store_lanes(v + c, vv);
    F32xV root = vv / bias2;
    sqrt_lanes(root);
    const F32xV step = (mv / bias1) / (root + h.eps) + h.weight_decay * wv;
    detail::store_lanes(w + c, wv - h.lr * step);
  }
  for (; c < dim; ++c) {  // the last dim % kLanes (a multiple of 4)
    m[c] = b1 * m[c] + (1.0f - b1) * g[c];
    v[c] = b2 * v[c] + (1.0f - b2) * g[c] * g[c];
    const float step = (m[c] / bias1) / (std::sqrt(v[c] / bias2) + h.eps) + h.weight_decay * w[c];
    w[c] -= h.lr * step;
  }
}
#pragma GCC diagnostic pop

// The fused update of one f32 row w[0, dim) with its gradient g. See EmbeddingOptimizerHyper for
// the formulas.
void update_row(float* w, float* g, int64_t dim, const EmbeddingOptimizerHyper& h, float* row_state,
                float* m, float* v, float bias1, float bias2) {
  const float lr = h.lr, eps = h.eps, wd = h.weight_decay;
  switch (h.kind) {
    case EmbeddingOptimizer::kNone:
      return;
    case EmbeddingOptimizer::kSgd:
      for (int64_t c = 0; c < dim; ++c) w[c] -= lr * (g[c] + wd * w[c]);
      return;
    case EmbeddingOptimizer::kRowwiseAdagrad: {
      if (wd != 0.0f)
        for (int64_t c = 0; c < dim; ++c) g[c] += wd * w[c];
      const float state = *row_state + detail::dot_row(g, g, dim) / float(dim);
      *row_state = state;
      const float multiplier = lr / (std::sqrt(state) + eps);
      for (int64_t c = 0; c < dim; ++c) w[c] -= multiplier * g[c];
      return;
    }
    case EmbeddingOptimizer::kAdam:
      adam_row(w, g, dim, h, m, v, bias1, bias2);
      return;
  }
}

// bf16 / f16 rows: widened to f32, updated, and rounded back once (vectorised both ways; the
// per-element conversions would cost more than the update).
template <typename W>
void update_row(W* w, float* g, int64_t dim, const EmbeddingOptimizerHyper& h, float* row_state,
                float* m, float* v, float bias1, float bias2) {
  static thread_local std::vector<float> row;
  if (row.size() < size_t(dim)) row.resize(size_t(dim));
  detail::convert_row(w, row.data(), dim);
  update_row(row.data(), g, dim, h, row_state, m, v, bias1, bias2);
  detail::convert_row(row.data(), w, dim);
}

template <typename W, typename Index>
void fused_impl(const EmbeddingTables& tables, W* weights, const EmbeddingBagIndices<Index>& in,
                const float* dout, const EmbeddingOptimizerHyper& h,
                const EmbeddingOptimizerState& state, const EmbeddingBagOptions& opt) {
  const Segments s = detail::make_segments(tables, in, opt);
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
  const Segments s = detail::make_segments(tables, in, opt);
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
  const Segments s = detail::make_segments(tables, in, opt);
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
        stream_row(grad.values + grad.value_offsets[k], g, tables.dims[t]);
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
