// loom-dlrm's synthetic click data (core/io/click_data.h): determinism from the seed, the
// CSR feature-major layout, the label rate, a ceiling well above chance, and the AUC helpers on
// hand-computed cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "core/io/click_data.h"
#include "testing/files.h"

namespace loom::io {
namespace {

using testing::expect_error;

ClickDataConfig small_config() {
  ClickDataConfig c;
  c.seed = 7;
  c.num_dense = 5;
  c.table_rows = {10, 3, 50};
  c.batch_size = 16;
  c.max_bag_size = 4;
  return c;
}

std::vector<int64_t> ints(const Tensor& t) { return t.to_vector<int64_t>(); }
std::vector<float> floats(const Tensor& t) { return t.to_vector<float>(); }

// The bag of example b in table t of a batch of B examples.
std::vector<int64_t> bag(const ClickBatch& batch, int64_t t, int64_t b) {
  const std::vector<int64_t> off = ints(batch.offsets), idx = ints(batch.indices);
  const int64_t B = batch.batch_size();
  return std::vector<int64_t>(idx.begin() + off[size_t(t * B + b)],
                              idx.begin() + off[size_t(t * B + b + 1)]);
}

void expect_same(const ClickBatch& a, const ClickBatch& b) {
  EXPECT_EQ(floats(a.dense), floats(b.dense));
  EXPECT_EQ(ints(a.indices), ints(b.indices));
  EXPECT_EQ(ints(a.offsets), ints(b.offsets));
  EXPECT_EQ(floats(a.labels), floats(b.labels));
  EXPECT_EQ(floats(a.probabilities), floats(b.probabilities));
}

TEST(ClickData, SameSeedSameBatchesOtherSeedOtherBatches) {
  const ClickDataset one(small_config()), two(small_config());
  for (int64_t i : {0, 1, 5})
    expect_same(one.batch(ClickSplit::kTrain, i), two.batch(ClickSplit::kTrain, i));
  ClickDataConfig other = small_config();
  other.seed = 8;
  EXPECT_NE(floats(ClickDataset(other).batch(ClickSplit::kTrain, 0).dense),
            floats(one.batch(ClickSplit::kTrain, 0).dense));
  // Consecutive batches and the two splits are different examples.
  EXPECT_NE(floats(one.batch(ClickSplit::kTrain, 1).dense),
            floats(one.batch(ClickSplit::kTrain, 0).dense));
  EXPECT_NE(floats(one.batch(ClickSplit::kEval, 0).dense),
            floats(one.batch(ClickSplit::kTrain, 0).dense));
}

TEST(ClickData, LayoutIsFeatureMajorCsr) {
  const ClickDataConfig c = small_config();
  const ClickBatch batch = ClickDataset(c).batch(ClickSplit::kTrain, 3);
  const int64_t B = c.batch_size, T = int64_t(c.table_rows.size());
  EXPECT_EQ(batch.batch_size(), B);
  EXPECT_EQ(batch.dense.shape(), (Shape{B, c.num_dense}));
  EXPECT_EQ(batch.dense.dtype(), DType::kF32);
  EXPECT_EQ(batch.labels.shape(), (Shape{B}));
  EXPECT_EQ(batch.probabilities.shape(), (Shape{B}));
  EXPECT_EQ(batch.offsets.shape(), (Shape{T * B + 1}));
  EXPECT_EQ(batch.offsets.dtype(), DType::kI64);
  EXPECT_EQ(batch.indices.dtype(), DType::kI64);
  EXPECT_EQ(batch.indices.dim(), 1);

  const std::vector<int64_t> off = ints(batch.offsets), idx = ints(batch.indices);
  EXPECT_EQ(off.front(), 0);
  EXPECT_EQ(off.back(), int64_t(idx.size()));
  std::set<int64_t> lengths;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t begin = off[size_t(t * B + b)], end = off[size_t(t * B + b + 1)];
      EXPECT_GE(end - begin, 1) << "table " << t << " bag " << b;
      EXPECT_LE(end - begin, c.max_bag_size) << "table " << t << " bag " << b;
      lengths.insert(end - begin);
      for (int64_t i = begin; i < end; ++i) {
        EXPECT_GE(idx[size_t(i)], 0);
        EXPECT_LT(idx[size_t(i)], c.table_rows[size_t(t)]) << "table " << t << " bag " << b;
      }
    }
  EXPECT_EQ(lengths, (std::set<int64_t>{1, 2, 3, 4}));  // 48 bags draw every length
  for (float y : floats(batch.labels)) EXPECT_TRUE(y == 0.0f || y == 1.0f);
  for (float p : floats(batch.probabilities)) {
    EXPECT_GT(p, 0.0f);
    EXPECT_LT(p, 1.0f);
  }
}

TEST(ClickData, OneHotWhenMaxBagSizeIsOne) {
  ClickDataConfig c = small_config();
  c.max_bag_size = 1;
  const ClickBatch batch = ClickDataset(c).batch(ClickSplit::kTrain, 0);
  std::vector<int64_t> expected(size_t(3 * c.batch_size + 1));
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = int64_t(i);
  EXPECT_EQ(ints(batch.offsets), expected);
}

TEST(ClickData, AnyRangeOfExamplesIsTheSliceOfTheBatch) {
  // A data-parallel rank generating its share alone gets exactly its rows of the global batch.
  const ClickDataConfig c = small_config();
  const ClickDataset data(c);
  const ClickBatch whole = data.batch(ClickSplit::kTrain, 2);  // examples [32, 48)
  const ClickBatch part = data.examples(ClickSplit::kTrain, 32 + 5, 7);
  ASSERT_EQ(part.batch_size(), 7);
  EXPECT_EQ(floats(part.dense), floats(whole.dense.narrow(0, 5, 7)));
  EXPECT_EQ(floats(part.labels), floats(whole.labels.narrow(0, 5, 7)));
  EXPECT_EQ(floats(part.probabilities), floats(whole.probabilities.narrow(0, 5, 7)));
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t b = 0; b < 7; ++b) EXPECT_EQ(bag(part, t, b), bag(whole, t, 5 + b));
}

TEST(ClickData, LabelRateFollowsTheHiddenProbabilities) {
  ClickDataConfig c;  // the defaults: bias 0, a symmetric score, a click rate of 1/2
  c.batch_size = 4096;
  for (double bias : {0.0, -2.0}) {
    c.bias = bias;
    const ClickDataset data(c);
    double labels = 0, p = 0;
    const int64_t batches = 5;
    for (int64_t i = 0; i < batches; ++i) {
      const ClickBatch batch = data.batch(ClickSplit::kTrain, i);
      for (float y : floats(batch.labels)) labels += y;
      for (float q : floats(batch.probabilities)) p += q;
    }
    const double n = double(batches * c.batch_size);
    EXPECT_NEAR(labels / n, p / n, 0.015) << "bias " << bias;  // 3.5 sigma of 20480 draws
    if (bias == 0.0) EXPECT_NEAR(labels / n, 0.5, 0.02);
    if (bias == -2.0) EXPECT_LT(labels / n, 0.35);
  }
}

TEST(ClickData, CeilingIsWellAboveChance) {
  const ClickDataset data{ClickDataConfig{}};
  const ClickCeiling ceiling = data.ceiling(1 << 15);
  EXPECT_EQ(ceiling.num_examples, 1 << 15);
  EXPECT_GT(ceiling.accuracy, 0.7);
  EXPECT_LT(ceiling.accuracy, 0.95);  // the labels are noisy: there is something left to miss
  EXPECT_GT(ceiling.auc, 0.8);
  EXPECT_NEAR(ceiling.positive_rate, 0.5, 0.02);
  // The ceiling is a property of the hidden model, the same for every run with this seed.
  EXPECT_EQ(data.ceiling(1 << 12).accuracy,
            ClickDataset(ClickDataConfig{}).ceiling(1 << 12).accuracy);

  // The Bayes scorer p on drawn held-out labels scores what the ceiling says, up to label noise;
  // and predicting p > 1/2 is right as often as the Bayes accuracy says.
  ClickDataConfig c;
  c.batch_size = 1 << 15;
  const ClickBatch held_out = ClickDataset(c).batch(ClickSplit::kEval, 0);
  EXPECT_NEAR(auc(held_out.probabilities, held_out.labels), ceiling.auc, 0.01);
  const std::vector<float> p = floats(held_out.probabilities), y = floats(held_out.labels);
  double right = 0;
  for (size_t i = 0; i < p.size(); ++i) right += (p[i] > 0.5f) == (y[i] == 1.0f);
  EXPECT_NEAR(right / double(p.size()), ceiling.accuracy, 0.01);
}

TEST(ClickData, EachTermOfTheScoreCarriesSignal) {
  // With only one of the three terms switched on, the labels are still far from coin flips.
  for (int term = 0; term < 3; ++term) {
    ClickDataConfig c;
    c.dense_variance = term == 0 ? 4.0 : 0.0;
    c.categorical_variance = term == 1 ? 4.0 : 0.0;
    c.interaction_variance = term == 2 ? 4.0 : 0.0;
    EXPECT_GT(ClickDataset(c).ceiling(1 << 13).accuracy, 0.7) << "term " << term;
  }
  ClickDataConfig none;
  none.dense_variance = none.categorical_variance = none.interaction_variance = 0.0;
  EXPECT_NEAR(ClickDataset(none).ceiling(1 << 10).accuracy, 0.5, 1e-6);  // p = 1/2 everywhere
}

TEST(ClickData, BadConfigNamesTheField) {
  ClickDataConfig c;
  c.table_rows = {};
  expect_error([&] { ClickDataset{c}; }, {"click_data", "table_rows"});
  c.table_rows = {10, 0};
  expect_error([&] { ClickDataset{c}; }, {"click_data", "table 1", "table_rows[1] = 0"});
  c = ClickDataConfig{};
  c.max_bag_size = 0;
  expect_error([&] { ClickDataset{c}; }, {"click_data", "max_bag_size", "0"});
  c = ClickDataConfig{};
  c.batch_size = -1;
  expect_error([&] { ClickDataset{c}; }, {"click_data", "batch_size", "-1"});
  c = ClickDataConfig{};
  c.interaction_variance = -1;
  expect_error([&] { ClickDataset{c}; }, {"click_data", "variances", "interaction -1"});
  expect_error([] { ClickDataset(ClickDataConfig{}).batch(ClickSplit::kTrain, -1); },
               {"click_data", "batch index", "-1"});
}

// ---------------------------------------------------------------- auc

TEST(Auc, HandComputedCases) {
  // The textbook case: of the 4 (positive, negative) pairs, 3 are ordered right.
  EXPECT_DOUBLE_EQ(auc(std::vector<float>{0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(auc(std::vector<float>{1, 2, 3, 4}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(auc(std::vector<float>{1, 2, 3, 4}, {1, 1, 0, 0}), 0.0);
  // Ties count one half: pairs (0.5, 0.5) 1/2, (0.5, 0.2) 1, (0.9, 0.5) 1, (0.9, 0.2) 1.
  EXPECT_DOUBLE_EQ(auc(std::vector<float>{0.5f, 0.5f, 0.2f, 0.9f}, {1, 0, 0, 1}), 3.5 / 4);
  EXPECT_DOUBLE_EQ(auc(std::vector<float>{3, 3, 3, 3, 3}, {1, 0, 1, 0, 0}), 0.5);
  // Only the order matters: logits and their sigmoids give the same AUC.
  EXPECT_DOUBLE_EQ(auc(std::vector<float>{-3, 0.5f, 2, -1, 7}, {0, 1, 0, 1, 1}),
                   auc(std::vector<float>{0.047f, 0.62f, 0.88f, 0.27f, 0.999f}, {0, 1, 0, 1, 1}));
  // Tensor form: [B, 1] logits against [B] labels.
  EXPECT_DOUBLE_EQ(auc(Tensor::from_vector<float>({0.1f, 0.4f, 0.35f, 0.8f}, {4, 1}),
                       Tensor::from_vector<float>({0, 0, 1, 1}, {4})),
                   0.75);
}

TEST(Auc, AgreesWithCountingPairs) {
  const ClickBatch b = ClickDataset(small_config()).batch(ClickSplit::kEval, 0);
  std::vector<float> s = floats(b.dense.narrow(1, 0, 1)), y = floats(b.labels);
  for (size_t i = 0; i < s.size(); i += 3) s[i] = 0.25f;  // some ties
  double pairs = 0, right = 0;
  for (size_t i = 0; i < s.size(); ++i)
    for (size_t j = 0; j < s.size(); ++j)
      if (y[i] == 1 && y[j] == 0) {
        pairs += 1;
        right += s[i] > s[j] ? 1.0 : (s[i] == s[j] ? 0.5 : 0.0);
      }
  ASSERT_GT(pairs, 0);
  EXPECT_DOUBLE_EQ(auc(s, y), right / pairs);
}

TEST(Auc, BadInputIsAClearError) {
  expect_error(
      [] {
        auc(std::vector<float>{1, 2}, {1, 1});
      },
      {"auc", "one positive and one negative", "2 positives", "0 negatives"});
  expect_error(
      [] {
        auc(std::vector<float>{1, 2}, {1, 0.5f});
      },
      {"auc", "0 or 1", "0.5", "index 1"});
  expect_error([] { auc(std::vector<float>{1, 2, 3}, {1, 0}); }, {"auc", "3 scores", "2 labels"});
  expect_error([] { auc(std::vector<float>{1, NAN}, {1, 0}); }, {"auc", "NaN", "index 1"});
  expect_error([] { auc(Tensor::zeros({3}), Tensor::zeros({2})); }, {"auc", "[3]", "[2]"});
}

TEST(BayesCeiling, HandComputedCases) {
  EXPECT_DOUBLE_EQ(bayes_accuracy({0.9f, 0.1f, 0.5f}),
                   (double(0.9f) + (1 - double(0.1f)) + 0.5) / 3);
  // Two kinds of example, p = 0.9 and 0.1, equally many: a positive is of the first kind with
  // probability 0.9, a negative of the second with 0.9; AUC = 0.81 + (0.09 + 0.09) / 2 = 0.9.
  EXPECT_NEAR(bayes_auc({0.9f, 0.1f}), 0.9, 1e-7);
  EXPECT_NEAR(bayes_auc({0.9f, 0.1f, 0.1f, 0.9f}), 0.9, 1e-7);
  EXPECT_DOUBLE_EQ(bayes_auc({0.3f, 0.3f, 0.3f}), 0.5);  // nothing to rank by
  expect_error([] { bayes_auc({0.5f, 1.5f}); }, {"bayes_auc", "1.5", "index 1"});
  expect_error([] { bayes_auc({1.0f, 1.0f}); }, {"bayes_auc", "both labels"});
}

}  // namespace
}  // namespace loom::io
