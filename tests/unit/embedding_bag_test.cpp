// The embedding_bag op and nn::EmbeddingBagCollection: forward against a plain per-bag loop,
// gradients by finite differences, the fused optimizers against a dense gradient plus the
// update's formula, the sparse gradient against the dense one, and errors that name the table.
// (The kernels' own random-configuration tests are tests/unit/embedding_bag_kernel_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>

#include "core/embedding_bag.h"
#include "core/nn/embedding_bag_collection.h"
#include "core/ops.h"
#include "testing/files.h"
#include "testing/gradcheck.h"

namespace loom {
namespace {

using testing::expect_error;

// Two tables (3 x 4 and 5 x 8), batch 2; bags: t0 {1, 2} {} ; t1 {4} {0, 4, 3}.
struct Case {
  EmbeddingBagLayout layout{{3, 5}, {4, 8}, {"user", "item"}};
  std::vector<Tensor> tables = {testing::random_tensor({3, 4}, 1),
                                testing::random_tensor({5, 8}, 2)};
  std::vector<int64_t> idx = {1, 2, 4, 0, 4, 3};
  std::vector<int64_t> off = {0, 2, 2, 3, 6};
  Tensor indices() const { return Tensor::from_vector(idx, {int64_t(idx.size())}); }
  Tensor offsets() const { return Tensor::from_vector(off, {int64_t(off.size())}); }
};

// out[b, table t's columns] = pooled rows, written plainly.
std::vector<float> reference(const Case& c, EmbeddingPooling pooling,
                             const std::vector<float>& psw = {}) {
  const int64_t batch = 2, total = c.layout.total_dim();
  std::vector<float> out(size_t(batch * total), 0.0f);
  for (int64_t t = 0; t < 2; ++t) {
    const std::vector<float> w = c.tables[size_t(t)].to_vector<float>();
    const int64_t d = c.layout.dim(t);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t lo = c.off[size_t(t * batch + b)], hi = c.off[size_t(t * batch + b + 1)];
      for (int64_t p = lo; p < hi; ++p)
        for (int64_t j = 0; j < d; ++j) {
          float v = w[size_t(c.idx[size_t(p)] * d + j)] * (psw.empty() ? 1.0f : psw[size_t(p)]);
          if (pooling == EmbeddingPooling::kMean) v /= float(hi - lo);
          out[size_t(b * total + c.layout.dim_offset(t) + j)] += v;
        }
    }
  }
  return out;
}

TEST(EmbeddingBag, SumAndMeanMatchAPlainLoop) {
  Case c;
  for (EmbeddingPooling pooling : {EmbeddingPooling::kSum, EmbeddingPooling::kMean}) {
    EmbeddingBagOptions o;
    o.pooling = pooling;
    Tensor out = embedding_bag(c.tables, c.layout, c.indices(), c.offsets(), Tensor(), o);
    ASSERT_EQ(out.shape(), (Shape{2, 12}));
    testing::expect_close(out, Tensor::from_vector(reference(c, pooling), {2, 12}), 1e-6, 1e-6);
  }
  // i32 indices, per-sample weights.
  std::vector<int32_t> idx32(c.idx.begin(), c.idx.end()), off32(c.off.begin(), c.off.end());
  Tensor psw = testing::random_tensor({6}, 3);
  Tensor out = embedding_bag(c.tables, c.layout, Tensor::from_vector(idx32, {6}),
                             Tensor::from_vector(off32, {5}), psw);
  testing::expect_close(
      out,
      Tensor::from_vector(reference(c, EmbeddingPooling::kSum, psw.to_vector<float>()), {2, 12}),
      1e-6, 1e-6);
}

TEST(EmbeddingBag, UnpooledRowsInIndexOrder) {
  Case c;
  EmbeddingBagOptions o;
  o.pooling = EmbeddingPooling::kNone;
  Tensor out = embedding_bag(c.tables, c.layout, c.indices(), c.offsets(), Tensor(), o);
  ASSERT_EQ(out.numel(), 2 * 4 + 4 * 8);  // table 0's 2 lookups of 4, table 1's 4 of 8
  const std::vector<float> got = out.to_vector<float>();
  const std::vector<float> w0 = c.tables[0].to_vector<float>(), w1 = c.tables[1].to_vector<float>();
  for (int j = 0; j < 4; ++j) EXPECT_EQ(got[size_t(4 + j)], w0[size_t(2 * 4 + j)]);      // lookup 1
  for (int j = 0; j < 8; ++j) EXPECT_EQ(got[size_t(8 + 8 + j)], w1[size_t(0 * 8 + j)]);  // row 0
}

TEST(EmbeddingBag, GradientsByFiniteDifferences) {
  Case c;
  for (EmbeddingPooling pooling : {EmbeddingPooling::kSum, EmbeddingPooling::kMean}) {
    std::vector<Tensor> inputs = {c.tables[0].clone().set_requires_grad(true),
                                  c.tables[1].clone().set_requires_grad(true)};
    EmbeddingBagOptions o;
    o.pooling = pooling;
    testing::expect_gradients_match(
        [&](const std::vector<Tensor>& in) {
          return embedding_bag({in[0], in[1]}, c.layout, c.indices(), c.offsets(), Tensor(), o);
        },
        inputs);
  }
  std::vector<Tensor> inputs = {c.tables[0].clone().set_requires_grad(true),
                                c.tables[1].clone().set_requires_grad(true),
                                testing::random_tensor({6}, 4).set_requires_grad(true)};
  testing::expect_gradients_match(
      [&](const std::vector<Tensor>& in) {
        return embedding_bag({in[0], in[1]}, c.layout, c.indices(), c.offsets(), in[2]);
      },
      inputs);
}

TEST(EmbeddingBag, SparseGradientHoldsTheDenseGradientsRows) {
  Case c;
  std::vector<Tensor> tables = {c.tables[0].clone().set_requires_grad(true),
                                c.tables[1].clone().set_requires_grad(true)};
  Tensor dout = testing::random_tensor({2, 12}, 5);
  embedding_bag(tables, c.layout, c.indices(), c.offsets()).backward(dout);
  EmbeddingSparseGradient sparse =
      embedding_bag_sparse_grad(c.tables, c.layout, c.indices(), c.offsets(), dout);
  // Unique (table, row): (0,1) (0,2) (1,0) (1,3) (1,4), increasing.
  EXPECT_EQ(sparse.ids.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0, 2, 1, 0, 1, 3, 1, 4}));
  const std::vector<int64_t> at = sparse.value_offsets.to_vector<int64_t>();
  const std::vector<float> values = sparse.values.to_vector<float>();
  const std::vector<int64_t> ids = sparse.ids.to_vector<int64_t>();
  for (size_t u = 0; u + 1 < at.size(); ++u) {
    const int64_t t = ids[2 * u], r = ids[2 * u + 1], d = c.layout.dim(t);
    const std::vector<float> dense = tables[size_t(t)].grad().narrow(0, r, 1).to_vector<float>();
    ASSERT_EQ(at[u + 1] - at[u], d);
    for (int64_t j = 0; j < d; ++j)
      EXPECT_FLOAT_EQ(values[size_t(at[u] + j)], dense[size_t(j)]) << "table " << t << " row " << r;
  }
}

// ---------------------------------------------------------------- the module

TEST(EmbeddingBagCollection, TablesAreNamedViewsOfOneBuffer) {
  nn::EmbeddingBagCollection ebc({{"user", 3, 4}, {"item", 5, 8}});
  ebc.init_parameters(9);
  auto params = ebc.named_parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "user.weight");
  EXPECT_EQ(params[1].first, "item.weight");
  EXPECT_EQ(params[0].second.shape(), (Shape{3, 4}));
  EXPECT_TRUE(params[0].second.storage() == params[1].second.storage());
  EXPECT_EQ(params[1].second.offset() - params[0].second.offset(), 12);
  // Init std sqrt(1 / (3 rows)): item's 40 values lie well inside +-5 std.
  for (float v : params[1].second.to_vector<float>())
    EXPECT_LT(std::fabs(v), 5 * std::sqrt(1.0 / 15));

  // A weight given memory of its own (as a checkpoint load through set_data may) is put back.
  Case c;
  params[0].second.set_data(c.tables[0].clone());
  params[1].second.set_data(c.tables[1].clone());
  Tensor out = ebc.lookup(c.indices(), c.offsets());
  testing::expect_close(out, Tensor::from_vector(reference(c, EmbeddingPooling::kSum), {2, 12}),
                        1e-6, 1e-6);
  EXPECT_TRUE(ebc.weights()[0].storage() == ebc.weights()[1].storage());
}

// The fused backward's update equals a dense gradient followed by the optimizer's formula.
TEST(EmbeddingBagCollection, FusedOptimizersMatchDenseGradientPlusUpdate) {
  Case c;
  Tensor dout = testing::random_tensor({2, 12}, 6);
  // The dense gradients.
  std::vector<Tensor> plain = {c.tables[0].clone().set_requires_grad(true),
                               c.tables[1].clone().set_requires_grad(true)};
  embedding_bag(plain, c.layout, c.indices(), c.offsets()).backward(dout);
  for (EmbeddingOptimizer kind : {EmbeddingOptimizer::kSgd, EmbeddingOptimizer::kRowwiseAdagrad}) {
    nn::EmbeddingBagCollectionOptions o;
    o.fused.kind = kind;
    o.fused.lr = 0.1f;
    o.fused.eps = 1e-6f;
    nn::EmbeddingBagCollection ebc({{"user", 3, 4}, {"item", 5, 8}}, o);
    NoGradGuard no_grad;
    for (size_t t = 0; t < 2; ++t) {
      Tensor w = ebc.weights()[t];
      w.copy_(c.tables[t]);
    }
    {
      autograd::EnableGradGuard grad;
      ebc.lookup(c.indices(), c.offsets()).backward(dout);
    }
    for (size_t t = 0; t < 2; ++t) {
      EXPECT_FALSE(ebc.weights()[t].grad().defined()) << "fused: no gradient is materialised";
      const std::vector<float> w0 = c.tables[t].to_vector<float>();
      const std::vector<float> g = plain[t].grad().to_vector<float>();
      const std::vector<float> got = ebc.weights()[t].to_vector<float>();
      const int64_t d = c.layout.dim(int64_t(t));
      for (int64_t r = 0; r < c.layout.rows(int64_t(t)); ++r) {
        double ss = 0;
        for (int64_t j = 0; j < d; ++j) ss += double(g[size_t(r * d + j)]) * g[size_t(r * d + j)];
        const double state = ss / double(d);  // row-wise Adagrad, from zero
        for (int64_t j = 0; j < d; ++j) {
          const size_t i = size_t(r * d + j);
          const double want = kind == EmbeddingOptimizer::kSgd
                                  ? w0[i] - 0.1 * g[i]
                                  : w0[i] - 0.1 * g[i] / (std::sqrt(state) + 1e-6);
          EXPECT_NEAR(got[i], want, 1e-5) << "table " << t << " row " << r << " col " << j;
        }
      }
    }
    if (kind == EmbeddingOptimizer::kRowwiseAdagrad) {
      // Row 1 of item (never looked up) keeps a zero state; row 4 (twice) does not.
      const std::vector<float> state = ebc.fused_optimizer()->momentum1.to_vector<float>();
      EXPECT_EQ(state[3 + 1], 0.0f);
      EXPECT_GT(state[3 + 4], 0.0f);
    }
  }
}

// ---------------------------------------------------------------- bad input

TEST(EmbeddingBag, ErrorsNameTheTableBagAndPosition) {
  Case c;
  Tensor off = c.offsets();
  auto with_indices = [&](std::vector<int64_t> idx) {
    return [&c, idx, off] {
      embedding_bag(c.tables, c.layout, Tensor::from_vector(idx, {int64_t(idx.size())}), off);
    };
  };
  expect_error(with_indices({1, 2, 5, 0, 4, 3}),
               {"table 1 ('item'), bag 0", "index 5 at position 2", "outside [0, 5)"});
  expect_error(with_indices({1, -1, 4, 0, 4, 3}),
               {"table 0 ('user'), bag 0", "index -1 at position 1"});
  expect_error(
      [&] {
        embedding_bag(c.tables, c.layout, c.indices(),
                      Tensor::from_vector(std::vector<int64_t>{0, 2, 1, 3, 6}, {5}));
      },
      {"'offsets' decrease at position 2"});
  expect_error(
      [&] {
        embedding_bag(c.tables, c.layout, c.indices(),
                      Tensor::from_vector(std::vector<int64_t>{0, 2, 2, 3, 5}, {5}));
      },
      {"last offset", "is 5 but there are 6 indices"});
  expect_error(
      [&] {
        embedding_bag(c.tables, c.layout, c.indices(),
                      Tensor::from_vector(std::vector<int64_t>{0, 2, 2, 6}, {4}));
      },
      {"'offsets' has 4 entries", "2 * B + 1"});
  expect_error(
      [&] {
        embedding_bag(c.tables, c.layout, c.indices(),
                      Tensor::from_vector(std::vector<int32_t>{0, 2, 2, 3, 6}, {5}));
      },
      {"'indices' are i64 but 'offsets' are i32"});
  expect_error([&] { embedding_bag({c.tables[0]}, c.layout, c.indices(), off); },
               {"1 table tensors for a layout of 2 tables"});
  expect_error(
      [&] {
        embedding_bag({c.tables[1], c.tables[0]}, c.layout, c.indices(), off);
      },
      {"table 0 ('user')'s weight is [5, 8], expected [3, 4]"});
  EmbeddingBagOptions mean;
  mean.pooling = EmbeddingPooling::kMean;
  expect_error(
      [&] { embedding_bag(c.tables, c.layout, c.indices(), off, Tensor::ones({6}), mean); },
      {"per_sample_weights need sum pooling"});
  EmbeddingBagOptions fused;
  fused.fused = std::make_shared<EmbeddingFusedOptimizer>(
      kernels::EmbeddingOptimizerHyper{EmbeddingOptimizer::kSgd}, c.layout);
  expect_error([&] { embedding_bag(c.tables, c.layout, c.indices(), off, Tensor(), fused); },
               {"fused optimizer updates the tables in place", "one buffer"});
  expect_error([] { EmbeddingBagLayout bad({3}, {6}); }, {"table 0 has dim 6", "multiples of 4"});
  expect_error([] { nn::EmbeddingBagCollection bad({}); }, {"no tables"});
}

TEST(EmbeddingBag, WarnLooksUpRowZeroSkipIgnores) {
  Case c;
  std::vector<int64_t> idx = c.idx;
  idx[0] = 7;  // table 0, bag 0: {7, 2}
  Tensor bad = Tensor::from_vector(idx, {6});
  EmbeddingBagOptions warn;
  warn.bounds_check = EmbeddingBoundsCheck::kWarn;
  const std::vector<float> w =
      embedding_bag(c.tables, c.layout, bad, c.offsets(), Tensor(), warn).to_vector<float>();
  EmbeddingBagOptions skip;
  skip.bounds_check = EmbeddingBoundsCheck::kSkip;
  const std::vector<float> s =
      embedding_bag(c.tables, c.layout, bad, c.offsets(), Tensor(), skip).to_vector<float>();
  const std::vector<float> w0 = c.tables[0].to_vector<float>();
  for (int j = 0; j < 4; ++j) {
    EXPECT_FLOAT_EQ(w[size_t(j)], w0[size_t(j)] + w0[size_t(8 + j)]);  // row 0 + row 2
    EXPECT_FLOAT_EQ(s[size_t(j)], w0[size_t(8 + j)]);                  // row 2 only
  }
}

}  // namespace
}  // namespace loom
