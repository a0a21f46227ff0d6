// The click data of Note [Hidden click model] (core/io/click_data.h), and the AUC helpers.
//
// Draws: example e of a split takes Philox blocks (e << kBlockBits) + j of the split's stream, one
// block per draw: j = 0 the label's uniform, then two dense normals per block, then one block per
// table for the bag length, then one per possible lookup (table t, slot i < max_bag_size) for the
// row. Every draw has a fixed block whatever the lengths drawn, and no example's draws depend on
// another's.
#include "core/io/click_data.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/cpu/philox.h"

namespace loom::io {

namespace {

constexpr int kBlockBits = 20;  // Philox blocks per example: 2^20

uint64_t stream(const std::string& name) { return philox::hash_name(name.c_str()); }

uint64_t split_stream(ClickSplit split) {
  return stream(split == ClickSplit::kTrain ? "click_data/train" : "click_data/eval");
}

// Uniform in [0, n) from two 32-bit words (Lemire's multiply-shift; bias below n / 2^64).
int64_t uniform_below(uint32_t hi, uint32_t lo, int64_t n) {
  const uint64_t x = (uint64_t(hi) << 32) | lo;
  return int64_t((unsigned __int128)x * uint64_t(n) >> 64);
}

void check_label(float y, size_t i) {
  LOOM_CHECK(y == 0.0f || y == 1.0f, "auc: labels must be 0 or 1, got ", y, " at index ", i);
}

}  // namespace

struct ClickDataset::Example {
  std::vector<float> dense;                // [num_dense]
  std::vector<std::vector<int64_t>> bags;  // [T][length]
  float p = 0.0f;
  float label = 0.0f;
};

ClickDataset::ClickDataset(ClickDataConfig config) : config_(std::move(config)) {
  const ClickDataConfig& c = config_;
  const int64_t tables = num_tables();
  LOOM_CHECK(c.num_dense >= 0, "click_data: num_dense must be >= 0, got ", c.num_dense);
  LOOM_CHECK(tables >= 1, "click_data: table_rows must name at least one table");
  for (int64_t t = 0; t < tables; ++t)
    LOOM_CHECK(c.table_rows[size_t(t)] >= 1, "click_data: table ", t, " must have at least one ",
               "row, got table_rows[", t, "] = ", c.table_rows[size_t(t)]);
  LOOM_CHECK(c.batch_size >= 1, "click_data: batch_size must be >= 1, got ", c.batch_size);
  LOOM_CHECK(c.max_bag_size >= 1, "click_data: max_bag_size must be >= 1, got ", c.max_bag_size);
  LOOM_CHECK(c.dense_variance >= 0 && c.categorical_variance >= 0 && c.interaction_variance >= 0,
             "click_data: the score's variances must be >= 0, got dense ", c.dense_variance,
             ", categorical ", c.categorical_variance, ", interaction ", c.interaction_variance);
  LOOM_CHECK(c.latent_dim >= 1, "click_data: latent_dim must be >= 1, got ", c.latent_dim);
  const int64_t blocks = 1 + (c.num_dense + 1) / 2 + tables * (1 + c.max_bag_size);
  LOOM_CHECK(blocks <= (int64_t(1) << kBlockBits), "click_data: an example needs ", blocks,
             " random blocks (1 + num_dense/2 + T * (1 + max_bag_size)), more than the ",
             int64_t(1) << kBlockBits, " it may use; use fewer tables or shorter bags");

  const uint64_t w_stream = stream("click_data/dense_weight");
  const float w_std =
      c.num_dense > 0 ? float(std::sqrt(c.dense_variance / double(c.num_dense))) : 0;
  for (int64_t k = 0; k < c.num_dense; ++k) {
    const philox::Block b = philox::element_block(c.seed, w_stream, uint64_t(k));
    dense_weight_.push_back(w_std * philox::normal(b.v[0], b.v[1]));
  }
  // Per table, E[bag length] = m rows of variance row_value_std^2: categorical_variance over all
  // T tables. A pooled latent has entries of variance m s^2; a dot of two has variance
  // latent_dim (m s^2)^2, and the T (T - 1) / 2 of them add up to interaction_variance.
  const double m = (1.0 + double(c.max_bag_size)) / 2.0;
  row_value_std_ = float(std::sqrt(c.categorical_variance / (double(tables) * m)));
  const double pairs = double(tables) * double(tables - 1) / 2.0;
  if (pairs > 0)
    row_latent_std_ =
        float(std::sqrt(std::sqrt(c.interaction_variance / (pairs * double(c.latent_dim))) / m));
  for (int64_t t = 0; t < tables; ++t) {
    value_streams_.push_back(stream("click_data/row_value/" + std::to_string(t)));
    latent_streams_.push_back(stream("click_data/row_latent/" + std::to_string(t)));
  }
}

float ClickDataset::row_value(int64_t table, int64_t row) const {
  const philox::Block b =
      philox::element_block(config_.seed, value_streams_[size_t(table)], uint64_t(row));
  return row_value_std_ * philox::normal(b.v[0], b.v[1]);
}

void ClickDataset::add_row_latent(int64_t table, int64_t row, float* acc) const {
  const int64_t k = config_.latent_dim, blocks = (k + 1) / 2;
  for (int64_t i = 0; i < blocks; ++i) {
    const philox::Block b = philox::element_block(config_.seed, latent_streams_[size_t(table)],
                                                  uint64_t(row * blocks + i));
    acc[2 * i] += row_latent_std_ * philox::normal(b.v[0], b.v[1]);
    if (2 * i + 1 < k) acc[2 * i + 1] += row_latent_std_ * philox::normal(b.v[2], b.v[3]);
  }
}

ClickDataset::Example ClickDataset::draw(ClickSplit split, int64_t index) const {
  const ClickDataConfig& c = config_;
  const int64_t tables = num_tables(), k = c.latent_dim;
  const uint64_t key = c.seed, s = split_stream(split), base = uint64_t(index) << kBlockBits;
  auto block = [&](int64_t j) { return philox::element_block(key, s, base + uint64_t(j)); };

  Example ex;
  ex.dense.resize(size_t(c.num_dense));
  for (int64_t d = 0; d < c.num_dense; d += 2) {
    const philox::Block b = block(1 + d / 2);
    ex.dense[size_t(d)] = philox::normal(b.v[0], b.v[1]);
    if (d + 1 < c.num_dense) ex.dense[size_t(d + 1)] = philox::normal(b.v[2], b.v[3]);
  }
  const int64_t lengths_at = 1 + (c.num_dense + 1) / 2, rows_at = lengths_at + tables;
  ex.bags.resize(size_t(tables));
  for (int64_t t = 0; t < tables; ++t) {
    const philox::Block b = block(lengths_at + t);
    const int64_t length = 1 + std::min(c.max_bag_size - 1,
                                        int64_t(philox::uniform01(b.v[0]) * float(c.max_bag_size)));
    for (int64_t i = 0; i < length; ++i) {
      const philox::Block r = block(rows_at + t * c.max_bag_size + i);
      ex.bags[size_t(t)].push_back(uniform_below(r.v[0], r.v[1], c.table_rows[size_t(t)]));
    }
  }

  double score = c.bias;
  for (int64_t d = 0; d < c.num_dense; ++d)
    score += double(dense_weight_[size_t(d)]) * ex.dense[size_t(d)];
  std::vector<float> pooled(size_t(tables * k), 0.0f);  // [T, latent_dim], sum of u_t over the bag
  for (int64_t t = 0; t < tables; ++t)
    for (int64_t row : ex.bags[size_t(t)]) {
      score += row_value(t, row);
      if (row_latent_std_ > 0) add_row_latent(t, row, pooled.data() + t * k);
    }
  for (int64_t t = 1; t < tables && row_latent_std_ > 0; ++t)
    for (int64_t u = 0; u < t; ++u)
      for (int64_t i = 0; i < k; ++i)
        score += double(pooled[size_t(t * k + i)]) * pooled[size_t(u * k + i)];

  ex.p = float(1.0 / (1.0 + std::exp(-score)));
  ex.label = philox::uniform01(block(0).v[0]) < ex.p ? 1.0f : 0.0f;
  return ex;
}

ClickBatch ClickDataset::batch(ClickSplit split, int64_t index) const {
  LOOM_CHECK(index >= 0, "click_data: batch index must be >= 0, got ", index);
  return examples(split, index * config_.batch_size, config_.batch_size);
}

ClickBatch ClickDataset::examples(ClickSplit split, int64_t first, int64_t count) const {
  LOOM_CHECK(first >= 0 && count >= 0, "click_data: examples [", first, ", ", first + count,
             ") must have first >= 0 and count >= 0");
  LOOM_CHECK(first + count <= (int64_t(1) << (64 - kBlockBits)), "click_data: examples [", first,
             ", ", first + count, ") go past the last example, 2^", 64 - kBlockBits);
  const int64_t tables = num_tables(), nd = config_.num_dense;
  std::vector<Example> drawn(static_cast<size_t>(count));
#pragma omp parallel for schedule(static) if (count >= 64)
  for (int64_t b = 0; b < count; ++b) drawn[size_t(b)] = draw(split, first + b);

  const size_t n = static_cast<size_t>(count);
  std::vector<float> dense(n * size_t(nd)), labels(n), p(n);
  std::vector<int64_t> offsets(size_t(tables * count + 1), 0), indices;
  for (int64_t b = 0; b < count; ++b) {
    const Example& ex = drawn[size_t(b)];
    std::copy(ex.dense.begin(), ex.dense.end(), dense.begin() + b * nd);
    labels[size_t(b)] = ex.label;
    p[size_t(b)] = ex.p;
  }
  for (int64_t t = 0; t < tables; ++t)  // feature-major: all of table 0's bags, then table 1's
    for (int64_t b = 0; b < count; ++b) {
      const std::vector<int64_t>& bag = drawn[size_t(b)].bags[size_t(t)];
      indices.insert(indices.end(), bag.begin(), bag.end());
      offsets[size_t(t * count + b + 1)] = int64_t(indices.size());
    }

  ClickBatch batch;
  batch.dense = Tensor::from_vector(dense, {count, nd});
  batch.indices = Tensor::from_vector(indices, {int64_t(indices.size())});
  batch.offsets = Tensor::from_vector(offsets, {tables * count + 1});
  batch.labels = Tensor::from_vector(labels, {count});
  batch.probabilities = Tensor::from_vector(p, {count});
  return batch;
}

ClickCeiling ClickDataset::ceiling(int64_t num_examples) const {
  LOOM_CHECK(num_examples >= 2, "click_data: ceiling needs at least 2 examples, got ",
             num_examples);
  std::vector<float> p(static_cast<size_t>(num_examples));
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < num_examples; ++e) p[size_t(e)] = draw(ClickSplit::kEval, e).p;
  ClickCeiling c;
  c.accuracy = bayes_accuracy(p);
  c.auc = bayes_auc(p);
  c.positive_rate = std::accumulate(p.begin(), p.end(), 0.0) / double(num_examples);
  c.num_examples = num_examples;
  return c;
}

double auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  LOOM_CHECK(scores.size() == labels.size(), "auc: ", scores.size(), " scores but ", labels.size(),
             " labels");
  int64_t positives = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    check_label(labels[i], i);
    LOOM_CHECK(!std::isnan(scores[i]), "auc: score at index ", i, " is NaN");
    positives += labels[i] == 1.0f;
  }
  const int64_t negatives = int64_t(labels.size()) - positives;
  LOOM_CHECK(positives > 0 && negatives > 0, "auc: needs at least one positive and one negative ",
             "label, got ", positives, " positives and ", negatives, " negatives");
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney: the positives' ranks (1-based, ties given their average rank) minus the least
  // they could sum to, over the number of (positive, negative) pairs.
  double rank_sum = 0.0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    int64_t group_positives = 0;
    for (; j < order.size() && scores[order[j]] == scores[order[i]]; ++j)
      group_positives += labels[order[j]] == 1.0f;
    rank_sum += double(group_positives) * (double(i + 1) + double(j)) / 2.0;
    i = j;
  }
  const double least = double(positives) * double(positives + 1) / 2.0;
  return (rank_sum - least) / (double(positives) * double(negatives));
}

double auc(const Tensor& scores, const Tensor& labels) {
  LOOM_CHECK(scores.defined() && labels.defined(), "auc: scores and labels must be defined");
  LOOM_CHECK(scores.numel() == labels.numel(), "auc: scores ", shape_str(scores.shape()),
             " and labels ", shape_str(labels.shape()), " must have the same number of elements");
  LOOM_CHECK(scores.dtype() == DType::kF32 && labels.dtype() == DType::kF32,
             "auc: scores and labels must be f32, got ", dtype_name(scores.dtype()), " and ",
             dtype_name(labels.dtype()));
  return auc(scores.to_vector<float>(), labels.to_vector<float>());
}

double bayes_accuracy(const std::vector<float>& p) {
  LOOM_CHECK(!p.empty(), "bayes_accuracy: needs at least one probability");
  double total = 0.0;
  for (float v : p) total += std::max(double(v), 1.0 - double(v));
  return total / double(p.size());
}

double bayes_auc(const std::vector<float>& p) {
  for (size_t i = 0; i < p.size(); ++i)
    LOOM_CHECK(p[i] >= 0.0f && p[i] <= 1.0f, "bayes_auc: probability ", p[i], " at index ", i,
               " is outside [0, 1]");
  std::vector<float> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  // Walking up the sorted p's: a group of equal p is a positive with weight sum(p) and a negative
  // with weight sum(1 - p); its positives beat every negative weight below it and tie with its own.
  double concordant = 0.0, negatives_below = 0.0, positive_total = 0.0;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    double pos = 0.0, neg = 0.0;
    for (; j < sorted.size() && sorted[j] == sorted[i]; ++j) {
      pos += sorted[j];
      neg += 1.0 - double(sorted[j]);
    }
    concordant += pos * (negatives_below + 0.5 * neg);
    negatives_below += neg;
    positive_total += pos;
    i = j;
  }
  LOOM_CHECK(positive_total > 0 && negatives_below > 0, "bayes_auc: needs some probability of ",
             "both labels, got total positive weight ", positive_total, " and negative weight ",
             negatives_below);
  return concordant / (positive_total * negatives_below);
}

}  // namespace loom::io
