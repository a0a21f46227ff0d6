// The CPU table-batched embedding-bag kernels against a naive reference written plainly below
// (per table, per bag, in double), on random configurations with fixed seeds: forward and
// backward (dense, sparse, per-sample-weight gradients), the fused optimizers against their
// formulas, bit-identical backward over runs and thread counts, every validation error, and the
// warn / skip bounds-check modes. Tolerances are relative to the magnitude of the summed terms
// (sum of |term|), which is what bounds the rounding of a sum: 1e-5 for f32 weights, 1e-2 for
// bf16 / f16 weights (compared with the f32 weights they were rounded from).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "kernels/cpu/embedding_bag.h"
#include "kernels/numeric.h"
#include "testing/embedding_bag_cases.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace loom::kernels {
namespace {

using Kind = EmbeddingBagErrorKind;
using namespace ::loom::kernels::testing;  // Case, random_case, ... (shared with the CUDA test)

// ---- the naive reference ----

// A value and the sum of |terms| that made it (the scale its rounding error is relative to).
struct Ref {
  std::vector<double> value, scale;
  explicit Ref(size_t n = 0) : value(n, 0.0), scale(n, 0.0) {}
  void add(size_t i, double term) {
    value[i] += term;
    scale[i] += std::fabs(term);
  }
};

// The row lookup p reads, by the documented bounds-check rule, or -1 if it contributes nothing.
int64_t ref_row(const Case& c, int64_t t, int64_t p) {
  const int64_t idx = c.indices[size_t(p)];
  if (idx >= 0 && idx < c.rows[size_t(t)]) return idx;
  return c.opt.bounds_check == EmbeddingBoundsCheck::kWarn ? 0 : -1;
}

double ref_bag_weight(const Case& c, int64_t t, int64_t b, int64_t p) {
  if (!c.psw.empty()) return c.psw[size_t(p)];
  if (c.opt.pooling != EmbeddingPooling::kMean) return 1.0;
  int64_t n = 0;
  for (int64_t q = c.offsets[size_t(t * c.batch + b)]; q < c.offsets[size_t(t * c.batch + b + 1)];
       ++q)
    n += ref_row(c, t, q) >= 0;
  return 1.0 / double(n);
}

// Where table t's block of the unpooled output starts (t = T: the output's size).
int64_t ref_table_start(const Case& c, int64_t t) {
  int64_t at = 0;
  for (int64_t u = 0; u < t; ++u)
    at +=
        (c.offsets[size_t((u + 1) * c.batch)] - c.offsets[size_t(u * c.batch)]) * c.dims[size_t(u)];
  return at;
}

// Where lookup p's row sits in the unpooled output (see Note [Embedding bag layout]).
int64_t ref_packed(const Case& c, int64_t t, int64_t p) {
  return ref_table_start(c, t) + (p - c.offsets[size_t(t * c.batch)]) * c.dims[size_t(t)];
}

// w: the f32 weights to use (the unrounded ones for bf16 / f16 cases).
Ref ref_forward(const Case& c, const std::vector<float>& w) {
  const bool none = c.opt.pooling == EmbeddingPooling::kNone;
  Ref out(size_t(none ? ref_table_start(c, c.num_tables) : c.batch * c.total_dim()));
  for (int64_t t = 0; t < c.num_tables; ++t) {
    const int64_t dim = c.dims[size_t(t)];
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t p = c.offsets[size_t(t * c.batch + b)];
           p < c.offsets[size_t(t * c.batch + b + 1)]; ++p) {
        const int64_t r = ref_row(c, t, p);
        if (r < 0) continue;
        const float* row = w.data() + c.weight_offsets[size_t(t)] + r * dim;
        for (int64_t d = 0; d < dim; ++d) {
          if (none)
            out.add(size_t(ref_packed(c, t, p) + d), row[d]);
          else
            out.add(size_t(b * c.total_dim() + c.dim_offsets[size_t(t)] + d),
                    ref_bag_weight(c, t, b, p) * row[d]);
        }
      }
  }
  return out;
}

// Dense weight gradient (weights' layout) and per-sample-weight gradient for output gradient dout.
struct RefGrad {
  Ref weights, psw;
};
RefGrad ref_backward(const Case& c, const std::vector<float>& w, const std::vector<float>& dout) {
  RefGrad g{Ref(w.size()), Ref(c.indices.size())};
  const bool none = c.opt.pooling == EmbeddingPooling::kNone;
  for (int64_t t = 0; t < c.num_tables; ++t) {
    const int64_t dim = c.dims[size_t(t)];
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t p = c.offsets[size_t(t * c.batch + b)];
           p < c.offsets[size_t(t * c.batch + b + 1)]; ++p) {
        const int64_t r = ref_row(c, t, p);
        if (r < 0) continue;
        const int64_t row = c.weight_offsets[size_t(t)] + r * dim;
        const int64_t d0 =
            none ? ref_packed(c, t, p) : b * c.total_dim() + c.dim_offsets[size_t(t)];
        const double s = none ? 1.0 : ref_bag_weight(c, t, b, p);
        for (int64_t d = 0; d < dim; ++d) {
          g.weights.add(size_t(row + d), s * dout[size_t(d0 + d)]);
          if (!none) g.psw.add(size_t(p), double(dout[size_t(d0 + d)]) * w[size_t(row + d)]);
        }
      }
  }
  return g;
}

double tolerance(EmbeddingDType dtype) { return dtype == EmbeddingDType::kF32 ? 1e-5 : 1e-2; }

// |got - ref| <= tol * (scale + 1e-6) elementwise; returns the number of elements that fail.
int64_t count_mismatches(const float* got, const Ref& ref, double tol, const char* what) {
  int64_t bad = 0;
  for (size_t i = 0; i < ref.value.size(); ++i)
    if (!(std::fabs(double(got[i]) - ref.value[i]) <= tol * (ref.scale[i] + 1e-6))) {
      if (bad++ < 5)
        ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", expected " << ref.value[i]
                      << " (scale " << ref.scale[i] << ")";
    }
  return bad;
}

size_t out_size(Case& c) {
  Lookups<int64_t> l(c);
  return c.opt.pooling == EmbeddingPooling::kNone
             ? size_t(cpu::embedding_bag_packed_size(c.tables(), l.view))
             : size_t(c.batch * c.total_dim());
}

// Compares the table blocks of a dense gradient (the gaps between tables are not the kernel's).
void expect_dense_grad(const Case& c, const std::vector<float>& grad, const Ref& ref) {
  for (int64_t t = 0; t < c.num_tables; ++t) {
    const size_t begin = size_t(c.weight_offsets[size_t(t)]);
    const size_t n = size_t(c.rows[size_t(t)] * c.dims[size_t(t)]);
    Ref block;
    block.value.assign(ref.value.begin() + long(begin), ref.value.begin() + long(begin + n));
    block.scale.assign(ref.scale.begin() + long(begin), ref.scale.begin() + long(begin + n));
    EXPECT_EQ(count_mismatches(grad.data() + begin, block, 1e-5, "dense grad"), 0) << "table " << t;
  }
}

// Forward, dense and sparse backward and the per-sample-weight gradient of one case against the
// reference, with index type I.
template <typename I>
void check_case(Case& c, const std::string& label) {
  SCOPED_TRACE(label);
  Lookups<I> l(c);
  ASSERT_TRUE(cpu::validate_embedding_bag(c.tables(), l.view, c.opt).ok());
  const double tol = tolerance(c.dtype);
  std::vector<float> out(out_size(c), -7.0f);
  cpu::embedding_bag_forward(c.tables(), c.weight_ptr(), l.view, out.data(), c.opt);
  EXPECT_EQ(count_mismatches(out.data(), ref_forward(c, c.weights), tol, "out"), 0);

  const std::vector<float> dout = random_floats(out.size(), 99);
  const RefGrad ref = ref_backward(c, c.weights, dout);
  std::vector<float> grad(c.weights.size(), -7.0f), gpsw(c.indices.size(), -7.0f);
  const bool weighted = c.opt.pooling == EmbeddingPooling::kSum;
  cpu::embedding_bag_backward_dense(c.tables(), c.weight_ptr(), l.view, dout.data(), grad.data(),
                                    weighted ? gpsw.data() : nullptr, c.opt);
  // Weight gradients do not depend on the weights' dtype: f32 sums of f32 dout.
  expect_dense_grad(c, grad, ref.weights);
  if (weighted) {
    EXPECT_EQ(count_mismatches(gpsw.data(), ref.psw, tol, "psw grad"), 0);
  }

  std::vector<int64_t> tables(c.indices.size()), rows(c.indices.size()), voff(c.indices.size() + 1);
  // The documented capacity: the packed lookup size.
  std::vector<float> values(size_t(cpu::embedding_bag_packed_size(c.tables(), l.view)));
  EmbeddingSparseGrad sparse{tables.data(), rows.data(), voff.data(), values.data()};
  const int64_t unique = cpu::embedding_bag_backward_sparse(c.tables(), c.weight_ptr(), l.view,
                                                            dout.data(), sparse, nullptr, c.opt);
  std::map<std::pair<int64_t, int64_t>, int> seen;
  for (int64_t t = 0; t < c.num_tables; ++t)
    for (int64_t p = c.offsets[size_t(t * c.batch)]; p < c.offsets[size_t((t + 1) * c.batch)]; ++p)
      if (ref_row(c, t, p) >= 0) seen[{t, ref_row(c, t, p)}] = 1;
  ASSERT_EQ(unique, int64_t(seen.size()));
  int64_t k = 0;
  for (const auto& [key, unused] : seen) {  // std::map iterates in (table, row) order
    ASSERT_EQ(tables[size_t(k)], key.first);
    ASSERT_EQ(rows[size_t(k)], key.second);
    const int64_t dim = c.dims[size_t(key.first)];
    ASSERT_EQ(voff[size_t(k + 1)] - voff[size_t(k)], dim);
    const int64_t row = c.weight_offsets[size_t(key.first)] + key.second * dim;
    for (int64_t d = 0; d < dim; ++d)
      ASSERT_FLOAT_EQ(values[size_t(voff[size_t(k)] + d)], grad[size_t(row + d)]);
    ++k;
  }
}

TEST(EmbeddingBagKernel, RandomConfigurationsMatchReference) {
  uint64_t seed = 0;
  for (EmbeddingDType dtype : {EmbeddingDType::kF32, EmbeddingDType::kBF16, EmbeddingDType::kF16})
    for (EmbeddingPooling pooling :
         {EmbeddingPooling::kSum, EmbeddingPooling::kMean, EmbeddingPooling::kNone})
      for (bool weighted : {false, true}) {
        if (weighted && pooling != EmbeddingPooling::kSum) continue;
        for (int rep = 0; rep < 6; ++rep) {
          CaseSpec spec;
          spec.dtype = dtype;
          spec.pooling = pooling;
          spec.weighted = weighted;
          Case c = random_case(spec, ++seed);
          const std::string label = std::string(dtype_name(dtype)) + " " + pooling_name(pooling) +
                                    (weighted ? " weighted" : "") + " seed " + std::to_string(seed);
          if (rep % 2 == 0)
            check_case<int32_t>(c, label + " int32");
          else
            check_case<int64_t>(c, label + " int64");
        }
      }
}

TEST(EmbeddingBagKernel, LargeBatchUsesEveryThreadPath) {
  // Big enough for the parallel forward and segment loop (more than 256 unique rows).
  CaseSpec spec;
  spec.max_tables = 3;
  spec.max_batch = 600;
  spec.max_bag = 40;
  spec.max_rows = 3000;
  spec.min_tables = 3;
  spec.min_batch = 600;
  spec.max_bag = 50;
  spec.empty_bag = 0.05;
  spec.weighted = true;
  Case big = random_case(spec, 12345);
  ASSERT_GT(big.indices.size(), size_t(1) << 15);
#if defined(_OPENMP)
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);  // ctest runs with one thread
#endif
  check_case<int64_t>(big, "large int64");
  check_case<int32_t>(big, "large int32");
#if defined(_OPENMP)
  omp_set_num_threads(saved);
#endif
}

TEST(EmbeddingBagKernel, MeanOfEmptyBagIsZero) {
  Case c;
  c.num_tables = 1;
  c.batch = 2;
  c.rows = {3};
  c.dims = {4};
  c.weight_offsets = {0, 12};
  c.row_offsets = {0, 3};
  c.dim_offsets = {0, 4};
  c.weights = random_floats(12, 3);
  c.indices = {1, 2};
  c.offsets = {0, 0, 2};  // bag 0 empty
  c.opt.pooling = EmbeddingPooling::kMean;
  Lookups<int32_t> l(c);
  std::vector<float> out(8, -1.0f);
  cpu::embedding_bag_forward(c.tables(), c.weight_ptr(), l.view, out.data(), c.opt);
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(out[size_t(d)], 0.0f);
    EXPECT_FLOAT_EQ(out[size_t(4 + d)],
                    0.5f * (c.weights[size_t(4 + d)] + c.weights[size_t(8 + d)]));
  }
}

// ---- fused optimizers ----

struct OptCase {
  EmbeddingOptimizerHyper hyper;
  EmbeddingDType dtype;
  EmbeddingPooling pooling;
};

// Applies the documented formula (EmbeddingOptimizerHyper) in double to every looked-up row.
void ref_update(const Case& c, const std::vector<double>& grad, const EmbeddingOptimizerHyper& h,
                std::vector<double>& w, std::vector<double>& m1, std::vector<double>& m2) {
  std::map<std::pair<int64_t, int64_t>, int> touched;
  for (int64_t t = 0; t < c.num_tables; ++t)
    for (int64_t p = c.offsets[size_t(t * c.batch)]; p < c.offsets[size_t((t + 1) * c.batch)]; ++p)
      if (ref_row(c, t, p) >= 0) touched[{t, ref_row(c, t, p)}] = 1;
  const double bc1 = 1.0 - std::pow(double(h.beta1), double(h.step));
  const double bc2 = 1.0 - std::pow(double(h.beta2), double(h.step));
  for (const auto& [key, unused] : touched) {
    const int64_t t = key.first, r = key.second, dim = c.dims[size_t(t)];
    const size_t row = size_t(c.weight_offsets[size_t(t)] + r * dim);
    std::vector<double> g(grad.begin() + long(row), grad.begin() + long(row) + dim);
    switch (h.kind) {
      case EmbeddingOptimizer::kSgd:
        for (int64_t d = 0; d < dim; ++d)
          w[row + size_t(d)] -= h.lr * (g[size_t(d)] + h.weight_decay * w[row + size_t(d)]);
        break;
      case EmbeddingOptimizer::kRowwiseAdagrad: {
        double sum = 0.0;
        for (int64_t d = 0; d < dim; ++d) {
          g[size_t(d)] += h.weight_decay * w[row + size_t(d)];
          sum += g[size_t(d)] * g[size_t(d)];
        }
        double& state = m1[size_t(c.row_offsets[size_t(t)] + r)];
        state += sum / double(dim);
        for (int64_t d = 0; d < dim; ++d)
          w[row + size_t(d)] -= h.lr * g[size_t(d)] / (std::sqrt(state) + h.eps);
        break;
      }
      case EmbeddingOptimizer::kAdam:
        for (int64_t d = 0; d < dim; ++d) {
          const size_t e = row + size_t(d);
          m1[e] = h.beta1 * m1[e] + (1.0 - h.beta1) * g[size_t(d)];
          m2[e] = h.beta2 * m2[e] + (1.0 - h.beta2) * g[size_t(d)] * g[size_t(d)];
          w[e] -= h.lr * ((m1[e] / bc1) / (std::sqrt(m2[e] / bc2) + h.eps) + h.weight_decay * w[e]);
        }
        break;
      case EmbeddingOptimizer::kNone:
        break;
    }
  }
}

void check_optimizer(const OptCase& oc, uint64_t seed) {
  CaseSpec spec;
  spec.dtype = oc.dtype;
  spec.pooling = oc.pooling;
  spec.weighted = oc.pooling == EmbeddingPooling::kSum && seed % 2 == 0;
  spec.max_rows = 12;  // duplicates: rows met several times in one batch
  Case c = random_case(spec, seed);
  Lookups<int64_t> l(c);
  const std::vector<float> dout = random_floats(out_size(c), seed + 7);

  // Reference gradient in double from the weights as stored, then the update in double.
  std::vector<float> stored(c.weights.size());
  for (size_t e = 0; e < stored.size(); ++e) stored[e] = c.stored(int64_t(e));
  const RefGrad ref = ref_backward(c, stored, dout);
  const bool adam = oc.hyper.kind == EmbeddingOptimizer::kAdam;
  std::vector<float> m1 = random_floats(size_t(adam ? c.weight_elems() : c.total_rows()), seed + 8);
  std::vector<float> m2 = random_floats(size_t(c.weight_elems()), seed + 9);
  for (float& x : m2) x = x * x;  // v >= 0
  if (!adam)
    for (float& x : m1) x = std::fabs(x);  // Adagrad state >= 0
  std::vector<double> w(stored.begin(), stored.end()), rm1(m1.begin(), m1.end()),
      rm2(m2.begin(), m2.end());
  ref_update(c, ref.weights.value, oc.hyper, w, rm1, rm2);

  std::vector<float> gpsw(c.indices.size());
  EmbeddingOptimizerState state{m1.data(), adam ? m2.data() : nullptr};
  cpu::embedding_bag_backward_fused(c.tables(), c.weight_ptr(), l.view, dout.data(), oc.hyper,
                                    state, spec.weighted ? gpsw.data() : nullptr, c.opt);
  if (spec.weighted) {  // from the weights before the update
    EXPECT_EQ(count_mismatches(gpsw.data(), ref.psw, tolerance(c.dtype), "psw grad"), 0);
  }
  const double tol = tolerance(c.dtype);
  for (int64_t t = 0; t < c.num_tables; ++t)
    for (int64_t e = c.weight_offsets[size_t(t)];
         e < c.weight_offsets[size_t(t)] + c.rows[size_t(t)] * c.dims[size_t(t)]; ++e)
      ASSERT_NEAR(c.stored(e), w[size_t(e)], tol * (1.0 + std::fabs(w[size_t(e)])))
          << "weight " << e << " table " << t;
  for (size_t i = 0; i < m1.size(); ++i)
    ASSERT_NEAR(m1[i], rm1[i], 1e-5 * (1.0 + std::fabs(rm1[i]))) << "state " << i;
  if (adam) {
    for (size_t i = 0; i < m2.size(); ++i)
      ASSERT_NEAR(m2[i], rm2[i], 1e-5 * (1.0 + std::fabs(rm2[i]))) << "v " << i;
  }
}

TEST(EmbeddingBagKernel, FusedSgdMatchesFormula) {
  uint64_t seed = 500;
  for (EmbeddingPooling pooling :
       {EmbeddingPooling::kSum, EmbeddingPooling::kMean, EmbeddingPooling::kNone})
    for (float wd : {0.0f, 0.01f})
      check_optimizer({hyper(EmbeddingOptimizer::kSgd, wd), EmbeddingDType::kF32, pooling}, ++seed);
}

TEST(EmbeddingBagKernel, FusedRowwiseAdagradMatchesFormula) {
  uint64_t seed = 600;
  for (EmbeddingPooling pooling :
       {EmbeddingPooling::kSum, EmbeddingPooling::kMean, EmbeddingPooling::kNone})
    for (float wd : {0.0f, 0.01f})
      check_optimizer(
          {hyper(EmbeddingOptimizer::kRowwiseAdagrad, wd), EmbeddingDType::kF32, pooling}, ++seed);
}

TEST(EmbeddingBagKernel, FusedAdamMatchesFormula) {
  uint64_t seed = 700;
  for (EmbeddingPooling pooling : {EmbeddingPooling::kSum, EmbeddingPooling::kMean})
    for (float wd : {0.0f, 0.01f})
      check_optimizer({hyper(EmbeddingOptimizer::kAdam, wd), EmbeddingDType::kF32, pooling},
                      ++seed);
}

TEST(EmbeddingBagKernel, FusedUpdatesOnHalfPrecisionWeights) {
  uint64_t seed = 800;
  for (EmbeddingDType dtype : {EmbeddingDType::kBF16, EmbeddingDType::kF16})
    for (EmbeddingOptimizer kind :
         {EmbeddingOptimizer::kSgd, EmbeddingOptimizer::kRowwiseAdagrad, EmbeddingOptimizer::kAdam})
      check_optimizer({hyper(kind, 0.0f), dtype, EmbeddingPooling::kSum}, ++seed);
}

// ---- determinism ----

// Heavy duplicates: table 0 has 3 rows and 1000 lookups; table 1 has per_bag * 50 lookups into
// rows1 rows of dim1 (more than 256 rows: the segment loop runs on all threads; more than 2^22
// lookups: so do the sort and the segment search, see Note [Embedding backward threads]).
Case duplicate_case(EmbeddingPooling pooling, int64_t per_bag, int64_t rows1, int64_t dim1) {
  Case c;
  c.num_tables = 2;
  c.batch = 50;
  c.rows = {3, rows1};
  c.dims = {36, dim1};
  c.weight_offsets = {0, 3 * 36, 3 * 36 + rows1 * dim1};
  c.row_offsets = {0, 3, 3 + rows1};
  c.dim_offsets = {0, 36, 36 + dim1};
  c.weights = random_floats(size_t(c.weight_offsets.back()), 41);
  c.opt.pooling = pooling;
  std::mt19937_64 gen(42);
  c.offsets.push_back(0);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t j = 0; j < (t == 0 ? 1000 / 50 : per_bag); ++j)
        c.indices.push_back(int64_t(gen() % uint64_t(c.rows[size_t(t)])));
      c.offsets.push_back(int64_t(c.indices.size()));
    }
  if (pooling == EmbeddingPooling::kSum) c.psw = random_floats(c.indices.size(), 43);
  return c;
}

// Everything the backward produces, as bytes: dense gradient, per-sample-weight gradient,
// row-wise Adagrad weights and state, Adam weights and state.
std::vector<float> backward_bits(Case c) {
  Lookups<int32_t> l(c);
  const std::vector<float> dout = random_floats(out_size(c), 44);
  std::vector<float> grad(c.weights.size()), gpsw(c.indices.size());
  const bool weighted = !c.psw.empty();
  cpu::embedding_bag_backward_dense(c.tables(), c.weight_ptr(), l.view, dout.data(), grad.data(),
                                    weighted ? gpsw.data() : nullptr, c.opt);
  std::vector<float> all = grad;
  all.insert(all.end(), gpsw.begin(), gpsw.end());
  for (EmbeddingOptimizer kind : {EmbeddingOptimizer::kRowwiseAdagrad, EmbeddingOptimizer::kAdam}) {
    Case u = c;
    const bool adam = kind == EmbeddingOptimizer::kAdam;
    std::vector<float> m1(size_t(adam ? u.weight_elems() : u.total_rows()), 0.0f),
        m2(size_t(u.weight_elems()), 0.0f);
    EmbeddingOptimizerState state{m1.data(), m2.data()};
    cpu::embedding_bag_backward_fused(u.tables(), u.weight_ptr(), l.view, dout.data(),
                                      hyper(kind, 0.0f), state, nullptr, u.opt);
    all.insert(all.end(), u.weights.begin(), u.weights.end());
    all.insert(all.end(), m1.begin(), m1.end());
    if (adam) all.insert(all.end(), m2.begin(), m2.end());
  }
  return all;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// backward_bits on 2 threads, `runs` times, then on 1 and 3 threads: all the same bits.
void expect_deterministic(const Case& c, int runs) {
#if defined(_OPENMP)
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
#endif
  const std::vector<float> first = backward_bits(c);
  for (int run = 1; run < runs; ++run) EXPECT_TRUE(same_bits(first, backward_bits(c))) << run;
#if defined(_OPENMP)
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    EXPECT_TRUE(same_bits(first, backward_bits(c))) << threads << " threads";
  }
  omp_set_num_threads(saved);
#endif
}

TEST(EmbeddingBagKernel, BackwardIsBitIdenticalOverRunsAndThreadCounts) {
  for (EmbeddingPooling pooling : {EmbeddingPooling::kSum, EmbeddingPooling::kMean}) {
    SCOPED_TRACE(pooling_name(pooling));
    expect_deterministic(duplicate_case(pooling, 60000 / 50, 500, 132), 5);
  }
}

TEST(EmbeddingBagKernel, LargeBackwardIsBitIdenticalOverThreadCounts) {
  const Case c = duplicate_case(EmbeddingPooling::kSum, 84000, 5000, 4);
  ASSERT_GT(c.indices.size(), size_t(1) << 22);  // the parallel sort
  expect_deterministic(c, 2);
}

// ---- validation and bounds-check modes ----

// A fixed shape for error positions: 3 tables, B = 2, bags of 2 lookups, rows 5 / 6 / 7.
template <typename I>
EmbeddingBagError validate(const Case& c) {
  Lookups<I> l(c);
  return cpu::validate_embedding_bag(c.tables(), l.view, c.opt);
}

template <typename I>
void expect_error(const Case& c, Kind kind, int64_t table, int64_t bag, int64_t position,
                  int64_t value) {
  const EmbeddingBagError e = validate<I>(c);
  EXPECT_EQ(int(e.kind), int(kind)) << embedding_bag_error_name(e.kind);
  EXPECT_EQ(e.table, table);
  EXPECT_EQ(e.bag, bag);
  EXPECT_EQ(e.position, position);
  EXPECT_EQ(e.value, value);
}

template <typename I>
void check_validation() {
  EXPECT_TRUE(validate<I>(small_case()).ok());
  {
    Case c = small_case();
    c.indices[7] = -3;  // table 1 (positions 4..7), bag 1
    c.indices[9] = -1;  // a later one is not reported
    expect_error<I>(c, Kind::kNegativeIndex, 1, 1, 7, -3);
  }
  {
    Case c = small_case();
    c.indices[10] = 7;  // table 2 has 7 rows
    expect_error<I>(c, Kind::kIndexOutOfRange, 2, 1, 10, 7);
    EXPECT_EQ(validate<I>(c).expected, 7);
  }
  {
    Case c = small_case();
    c.indices[5] = 6;  // table 1 has 6 rows; the bag is found past an empty bag
    c.offsets = {0, 2, 4, 4, 8, 10, 12};
    expect_error<I>(c, Kind::kIndexOutOfRange, 1, 1, 5, 6);
  }
  {
    Case c = small_case();
    c.offsets[3] = 1;  // bag 2 (table 1, bag 0) ends before it starts
    expect_error<I>(c, Kind::kDecreasingOffsets, 1, 0, 3, 1);
  }
  {
    Case c = small_case();
    c.offsets.back() = 11;
    expect_error<I>(c, Kind::kLastOffsetMismatch, 2, 1, 6, 11);
  }
  {
    Case c = small_case();
    c.offsets[0] = 1;
    expect_error<I>(c, Kind::kFirstOffsetNotZero, 0, 0, 0, 1);
  }
  {
    Case c = small_case();
    c.offsets.pop_back();  // T*B+1 = 7 expected
    expect_error<I>(c, Kind::kWrongLength, -1, -1, -1, 6);
    EXPECT_EQ(validate<I>(c).expected, 7);
  }
  {
    Case c = small_case();
    c.psw.assign(11, 1.0f);  // one short
    expect_error<I>(c, Kind::kWrongLength, -1, -1, -1, 11);
  }
  {
    Case c = small_case();
    c.psw.assign(12, 1.0f);
    c.opt.pooling = EmbeddingPooling::kMean;
    EXPECT_EQ(int(validate<I>(c).kind), int(Kind::kWeightsNeedSum));
  }
  {
    Case c = small_case();
    c.dims[1] = 6;
    expect_error<I>(c, Kind::kBadTable, 1, -1, -1, 6);
  }
  {
    // warn / skip: bad indices are not errors, bad offsets still are.
    Case c = small_case();
    c.indices[3] = 99;
    for (EmbeddingBoundsCheck mode : {EmbeddingBoundsCheck::kWarn, EmbeddingBoundsCheck::kSkip}) {
      c.opt.bounds_check = mode;
      EXPECT_TRUE(validate<I>(c).ok());
      Case d = c;
      d.offsets[2] = 5;
      d.offsets[3] = 4;
      EXPECT_EQ(int(validate<I>(d).kind), int(Kind::kDecreasingOffsets));
    }
  }
}

TEST(EmbeddingBagKernel, ValidationFindsEveryBadInput) {
  check_validation<int32_t>();
  check_validation<int64_t>();
}

// Warn: a bad index reads row 0 (and counts in a mean); skip: as if it were absent. Both are
// checked against the plain reference's rule and against an explicitly rewritten input.
template <typename I>
void check_bounds_mode(EmbeddingBoundsCheck mode, EmbeddingPooling pooling) {
  CaseSpec spec;
  spec.pooling = pooling;
  spec.weighted = pooling == EmbeddingPooling::kSum;
  Case c = random_case(spec, 31 + int(mode) * 3 + int(pooling));
  std::mt19937_64 gen(77);
  int64_t bad = 0;
  for (int64_t& idx : c.indices)
    if (gen() % 4 == 0) {
      idx = gen() % 2 ? -1 - int64_t(gen() % 5) : 1000 + int64_t(gen() % 5);
      ++bad;
    }
  ASSERT_GT(bad, 0);
  c.opt.bounds_check = mode;
  Lookups<I> l(c);
  ASSERT_TRUE(cpu::validate_embedding_bag(c.tables(), l.view, c.opt).ok());
  std::vector<float> out(out_size(c));
  EXPECT_EQ(cpu::embedding_bag_forward(c.tables(), c.weight_ptr(), l.view, out.data(), c.opt), bad);

  // The same batch rewritten by hand: bad indices set to 0 (warn) or removed (skip).
  Case e = c;
  e.opt.bounds_check = EmbeddingBoundsCheck::kError;
  e.indices.clear();
  e.psw.clear();
  e.offsets = {0};
  for (int64_t t = 0; t < c.num_tables; ++t)
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t p = c.offsets[size_t(t * c.batch + b)];
           p < c.offsets[size_t(t * c.batch + b + 1)]; ++p) {
        const int64_t idx = c.indices[size_t(p)];
        const bool ok = idx >= 0 && idx < c.rows[size_t(t)];
        if (!ok && mode == EmbeddingBoundsCheck::kSkip) continue;
        e.indices.push_back(ok ? idx : 0);
        if (!c.psw.empty()) e.psw.push_back(c.psw[size_t(p)]);
      }
      e.offsets.push_back(int64_t(e.indices.size()));
    }
  Lookups<I> le(e);
  std::vector<float> expected(out_size(e));
  if (pooling != EmbeddingPooling::kNone) {  // kNone keeps a (zero) row per skipped lookup
    cpu::embedding_bag_forward(e.tables(), e.weight_ptr(), le.view, expected.data(), e.opt);
    EXPECT_TRUE(same_bits(out, expected));
  }
  EXPECT_EQ(count_mismatches(out.data(), ref_forward(c, c.weights), 1e-5, "out"), 0);

  const std::vector<float> dout = random_floats(out.size(), 5);
  std::vector<float> grad(c.weights.size()), gpsw(c.indices.size(), -1.0f);
  cpu::embedding_bag_backward_dense(c.tables(), c.weight_ptr(), l.view, dout.data(), grad.data(),
                                    spec.weighted ? gpsw.data() : nullptr, c.opt);
  const RefGrad ref = ref_backward(c, c.weights, dout);
  expect_dense_grad(c, grad, ref.weights);
  if (spec.weighted) {
    EXPECT_EQ(count_mismatches(gpsw.data(), ref.psw, 1e-5, "psw grad"), 0);
    if (mode == EmbeddingBoundsCheck::kSkip)
      for (size_t p = 0; p < c.indices.size(); ++p)
        if (c.indices[p] < 0 || c.indices[p] >= 1000) {
          EXPECT_EQ(gpsw[p], 0.0f);
        }
  }
}

TEST(EmbeddingBagKernel, WarnReadsRowZeroAndSkipDropsBadIndices) {
  for (EmbeddingBoundsCheck mode : {EmbeddingBoundsCheck::kWarn, EmbeddingBoundsCheck::kSkip})
    for (EmbeddingPooling pooling :
         {EmbeddingPooling::kSum, EmbeddingPooling::kMean, EmbeddingPooling::kNone}) {
      SCOPED_TRACE(std::string(mode == EmbeddingBoundsCheck::kWarn ? "warn " : "skip ") +
                   pooling_name(pooling));
      check_bounds_mode<int32_t>(mode, pooling);
      check_bounds_mode<int64_t>(mode, pooling);
    }
}

}  // namespace
}  // namespace loom::kernels
