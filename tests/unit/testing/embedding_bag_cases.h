// Random table-batched embedding-bag batches for the kernel tests: the CPU kernels against a naive
// reference (embedding_bag_kernel_test.cpp) and the CUDA kernels against the CPU ones
// (embedding_bag_cuda_test.cpp) draw their cases from here, so both test the same shapes.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "kernels/embedding_bag_types.h"
#include "kernels/numeric.h"

namespace loom::kernels::testing {

// One batch of tables and lookups, kept in int64 / f32 on the host; the kernels see the index type
// and weight dtype under test.
struct Case {
  int64_t num_tables = 0, batch = 0;
  std::vector<int64_t> rows, dims, weight_offsets, row_offsets, dim_offsets;  // T+1 offsets each
  EmbeddingDType dtype = EmbeddingDType::kF32;
  std::vector<float> weights;       // f32 weights (gaps hold values no lookup reads)
  std::vector<uint16_t> weights16;  // the bf16 / f16 weights when dtype is not f32
  std::vector<int64_t> indices, offsets;
  std::vector<float> psw;  // per-sample weights; empty: none
  EmbeddingBagOptions opt;

  EmbeddingTables tables() const {
    EmbeddingTables t;
    t.num_tables = num_tables;
    t.rows = rows.data();
    t.dims = dims.data();
    t.weight_offsets = weight_offsets.data();
    t.row_offsets = row_offsets.data();
    t.dim_offsets = dim_offsets.data();
    t.dtype = dtype;
    return t;
  }
  bool half() const { return dtype != EmbeddingDType::kF32; }
  int64_t total_dim() const { return dim_offsets[size_t(num_tables)]; }
  int64_t total_rows() const { return row_offsets[size_t(num_tables)]; }
  int64_t weight_elems() const { return int64_t(weights.size()); }
  void* weight_ptr() {
    return half() ? static_cast<void*>(weights16.data()) : static_cast<void*>(weights.data());
  }
  std::vector<uint8_t> weight_bytes() const {
    const uint8_t* p = half() ? reinterpret_cast<const uint8_t*>(weights16.data())
                              : reinterpret_cast<const uint8_t*>(weights.data());
    return std::vector<uint8_t>(p, p + weights.size() * (half() ? 2 : 4));
  }
  float stored(size_t e) const {  // a weight as the kernels see it
    if (dtype == EmbeddingDType::kBF16) return bf16_to_float(BFloat16{weights16[e]});
    if (dtype == EmbeddingDType::kF16) return f16_to_float(Float16{weights16[e]});
    return weights[e];
  }
  void round_weights() {
    weights16.resize(weights.size());
    for (size_t e = 0; e < weights.size(); ++e)
      weights16[e] = dtype == EmbeddingDType::kBF16 ? float_to_bf16(weights[e]).bits
                                                    : float_to_f16(weights[e]).bits;
  }
  // The same batch on |weights| and |per-sample weights|: its sums are the sums of |terms|.
  Case absolute() const {
    Case a = *this;
    for (float& w : a.weights) w = std::fabs(w);
    for (uint16_t& h : a.weights16) h = uint16_t(h & 0x7fffu);
    for (float& w : a.psw) w = std::fabs(w);
    return a;
  }
  // [begin, end) element ranges of the table blocks (a dense gradient's defined part).
  std::vector<std::pair<size_t, size_t>> blocks() const {
    std::vector<std::pair<size_t, size_t>> b;
    for (int64_t t = 0; t < num_tables; ++t)
      b.emplace_back(size_t(weight_offsets[size_t(t)]),
                     size_t(weight_offsets[size_t(t)] + rows[size_t(t)] * dims[size_t(t)]));
    return b;
  }
};

// A case's indices in index type I on the host (owning the converted arrays), as the kernels see
// them.
template <typename I>
struct Lookups {
  std::vector<I> indices, offsets;
  EmbeddingBagIndices<I> view;
  explicit Lookups(const Case& c)
      : indices(c.indices.begin(), c.indices.end()), offsets(c.offsets.begin(), c.offsets.end()) {
    view.batch_size = c.batch;
    view.indices = indices.data();
    view.num_indices = int64_t(indices.size());
    view.offsets = offsets.data();
    view.num_offsets = int64_t(offsets.size());
    view.per_sample_weights = c.psw.empty() ? nullptr : c.psw.data();
    view.num_per_sample_weights = int64_t(c.psw.size());
  }
};

struct CaseSpec {
  int64_t min_tables = 1, max_tables = 4, min_batch = 1, max_batch = 9;
  int64_t max_rows = 40, max_bag = 12;
  int64_t max_dim4 = 40;  // dims up to 4 * max_dim4 (160: past the CPU kernel's 128-column tile)
  double empty_bag = 0.2;
  EmbeddingDType dtype = EmbeddingDType::kF32;
  EmbeddingPooling pooling = EmbeddingPooling::kSum;
  bool weighted = false;
};

// Tables start at gaps of 0, 2, 4 or 8 elements after the previous one (they need not be back to
// back), so rows meet every alignment the kernels handle (Note [Embedding row alignment] in
// kernels/cuda/embedding_bag_impl.cuh).
inline Case random_case(const CaseSpec& s, uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  Case c;
  c.num_tables = uniform(s.min_tables, s.max_tables);
  c.batch = uniform(s.min_batch, s.max_batch);
  c.dtype = s.dtype;
  c.opt.pooling = s.pooling;
  c.weight_offsets = {0};
  c.row_offsets = {0};
  c.dim_offsets = {0};
  for (int64_t t = 0; t < c.num_tables; ++t) {
    const int64_t gaps[] = {0, 2, 4, 8};
    c.rows.push_back(uniform(1, s.max_rows));
    c.dims.push_back(4 * uniform(1, s.max_dim4));
    c.weight_offsets.back() += gaps[uniform(0, 3)];
    c.weight_offsets.push_back(c.weight_offsets.back() + c.rows.back() * c.dims.back());
    c.row_offsets.push_back(c.row_offsets.back() + c.rows.back());
    c.dim_offsets.push_back(c.dim_offsets.back() + c.dims.back());
  }
  c.weights.resize(size_t(c.weight_offsets.back()));
  for (float& w : c.weights) w = value(gen);
  if (c.half()) c.round_weights();
  c.offsets = {0};
  for (int64_t t = 0; t < c.num_tables; ++t)
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t len = std::bernoulli_distribution(s.empty_bag)(gen) ? 0 : uniform(1, s.max_bag);
      for (int64_t j = 0; j < len; ++j) c.indices.push_back(uniform(0, c.rows[size_t(t)] - 1));
      c.offsets.push_back(int64_t(c.indices.size()));
    }
  if (s.weighted)
    for (size_t p = 0; p < c.indices.size(); ++p) c.psw.push_back(value(gen));
  return c;
}

inline std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = value(gen);
  return v;
}

// Three tables of 5, 6 and 7 rows (dims 4, 8, 4, the second after a gap), two bags each.
inline Case small_case() {
  Case c;
  c.num_tables = 3;
  c.batch = 2;
  c.rows = {5, 6, 7};
  c.dims = {4, 8, 4};
  c.weight_offsets = {0, 20, 68, 96};
  c.row_offsets = {0, 5, 11, 18};
  c.dim_offsets = {0, 4, 12, 16};
  c.weights = random_floats(96, 5);
  c.indices = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
  c.offsets = {0, 2, 4, 6, 8, 10, 12};
  return c;
}

// The fused optimizers' hyperparameters both tests use.
inline EmbeddingOptimizerHyper hyper(EmbeddingOptimizer kind, float wd) {
  EmbeddingOptimizerHyper h;
  h.kind = kind;
  h.lr = 0.05f;
  h.eps = 1e-6f;
  h.weight_decay = wd;
  h.step = 3;
  return h;
}

inline const char* dtype_name(EmbeddingDType d) {
  return d == EmbeddingDType::kF32 ? "f32" : d == EmbeddingDType::kBF16 ? "bf16" : "f16";
}
inline const char* pooling_name(EmbeddingPooling p) {
  return p == EmbeddingPooling::kSum ? "sum" : p == EmbeddingPooling::kMean ? "mean" : "none";
}
inline const char* optimizer_name(EmbeddingOptimizer k) {
  return k == EmbeddingOptimizer::kSgd              ? "sgd"
         : k == EmbeddingOptimizer::kAdam           ? "adam"
         : k == EmbeddingOptimizer::kRowwiseAdagrad ? "rowwise adagrad"
                                                    : "none";
}

}  // namespace loom::kernels::testing
